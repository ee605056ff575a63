"""What the servers said during a load run: their counters by series name, read from each /metrics
page or from the Prometheus that scrapes a fleet, and the TTFT split by part."""
