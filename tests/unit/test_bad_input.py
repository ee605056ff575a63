"""Bad input to every command, as a user types it: a non-zero exit and one line on stderr (ours,
`mmscope: error: ...`, or argparse's usage and error for an option that does not parse), never a
traceback; and a reader that leaves a pipe early ends the command quietly."""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys

import pytest

from mmscope.carry import access_log

RUN_TIMEOUT_S = 120
ARGPARSE_ERROR = re.compile(r"^mmscope(?: [\w-]+)?: error: ")
PIPE_CLOSED_EXIT = 128 + signal.SIGPIPE

# (argv with {placeholders}, a fragment the error line must hold). Placeholders: {file} a plain
# file, {tmp} a fresh folder, {profile} an nsys SQLite profile, {log} an access log, {port} a
# loopback port nothing listens on; {corrupt} the profile with 200 bytes of its schema page
# flipped, {badtext} the profile with a range name that is no UTF-8, {nonvtx} a profile whose
# NVTX table holds no row, {othermetrics} a /metrics page without mmscope's series; loopback
# servers: {junkport} answers 200 OK with 200 random bytes, {noiseport} sends 220 random bytes
# and no HTTP at all, {silentport} accepts and never answers.
ROWS = [
    # demo
    ("demo --out {file}/demo", "{file}"),
    ("demo --out /proc/mmscope-demo", "/proc"),
    ("demo --out {tmp}/missing/demo", "folder does not exist: {tmp}/missing"),
    # tiny-model
    ("tiny-model {file}", "is not a directory"),
    ("tiny-model {file}/model", "{file}"),
    ("tiny-model {tmp}/missing/model --env", "folder does not exist: {tmp}/missing"),
    ("tiny-model /proc/tiny-model", "/proc"),
    ("tiny-model --seed x {tmp}/model", "--seed"),
    # doctor
    ("doctor --bogus", "unrecognized arguments"),
    ("doctor extra", "unrecognized arguments"),
    ("doctor --url not-a-url", "--url must start with http:// or https://"),
    ("doctor --url ftp://127.0.0.1/metrics", "--url must start with http:// or https://"),
    ("doctor --url http://127.0.0.1:{junkport}", "200 characters of binary data"),
    ("doctor --url http://127.0.0.1:{noiseport}", "cannot read http://127.0.0.1:{noiseport}"),
    ("doctor --url http://127.0.0.1:{silentport} --timeout 1", "no answer within 1 s"),
    ("doctor --url http://h --timeout 0", "--timeout"),
    # analyze
    ("analyze {tmp}/missing.sqlite", "no such file"),
    ("analyze --workers 0 {profile}", "--workers"),
    ("analyze --workers -3 {profile}", "--workers"),
    ("analyze --workers x {profile}", "--workers"),
    ("analyze --filter ( {profile}", "--filter"),
    ("analyze --html {file}/report.html {profile}", "{file}"),
    ("analyze --csv /proc/stages.csv {profile}", "/proc"),
    ("analyze --html {tmp}/missing/r.html {tmp}/missing.sqlite", "cannot create a file"),
    ("analyze {corrupt}", "not a readable SQLite database"),
    ("analyze --json {corrupt}", "not a readable SQLite database"),
    ("analyze {badtext}", "not a readable SQLite database"),
    ("analyze --json {badtext}", "not a readable SQLite database"),
    ("analyze {nonvtx}", "no NVTX ranges or marks"),
    ("analyze --metrics {tmp}/missing.txt {profile}", "no such file"),
    ("analyze --metrics {tmp} {profile}", "is a directory, not a /metrics page"),
    ("analyze --metrics ftp://127.0.0.1/metrics {profile}", "only http:// and https:// URLs"),
    ("analyze --metrics http://127.0.0.1:{junkport}/metrics {profile}",
     "200 characters of binary data"),
    ("analyze --metrics http://127.0.0.1:{noiseport}/metrics {profile}",
     "cannot read http://127.0.0.1:{noiseport}/metrics"),
    ("analyze --metrics http://127.0.0.1:{silentport}/metrics --timeout 1 {profile}",
     "no answer within 1 s"),
    ("analyze --timeout nan {profile}", "--timeout"),
    ("analyze --metrics {file} {profile}", "not a Prometheus /metrics page"),
    ("analyze --metrics {othermetrics} {profile}", "no vllm:encoder_cache_queries_total series"),
    ("analyze --metrics http://127.0.0.1:{port}/metrics {profile}",
     "cannot read http://127.0.0.1:{port}/metrics"),
    ("analyze --html {tmp}/r.html {nonvtx}", "no NVTX ranges or marks"),
    # compare
    ("compare {profile} {tmp}/missing.sqlite", "no such file"),
    ("compare --workers 0 {profile} {profile}", "--workers"),
    ("compare --filter [ {profile} {profile}", "--filter"),
    ("compare {profile} {badtext}", "not a readable SQLite database"),
    ("compare {corrupt} {profile}", "not a readable SQLite database"),
    ("compare --json {profile} {nonvtx}", "no NVTX ranges or marks"),
    # record
    ("record", "no command given"),
    ("record --linger -5 -o {tmp}/r.sqlite -- true", "--linger"),
    ("record --linger x -o {tmp}/r.sqlite -- true", "--linger"),
    ("record -o {file}/r.sqlite -- true", "{file}"),
    ("record -o /proc/r.sqlite -- true", "/proc"),
    ("record --spool-dir {tmp}/missing/spool -o {tmp}/r.sqlite -- true",
     "--spool-dir {tmp}/missing/spool: folder does not exist"),
    ("record --spool-dir {file} -o {tmp}/r.sqlite -- true", "is not a folder"),
    # load: URLs that name no server, numbers out of range, an unreachable server, a bad plot path
    ("load --url http://127.0.0.1:99999", "is not a URL: Port out of range 0-65535"),
    ("load --url http://127.0.0.1:0", "port 0 is out of range"),
    ("load --url http://[::1", "is not a URL"),
    ("load --url 'http://127.0.0.1:9 x'", "contains a space"),
    ("load --url http://127.0.0.1:9_x", "is not a URL"),
    ("load --url http://", "names no host"),
    ("load --url 127.0.0.1:8000", "must start with http:// or https://"),
    ("load --url http://127.0.0.1:8000/?x=1", "no query or fragment"),
    ("load --url http://127.0.0.1:{port} --timeout 30", "cannot reach http://127.0.0.1:{port}"),
    ("load --url http://h --reuse 1.5", "reuse levels must lie in [0, 1]"),
    ("load --url http://h --reuse nan", "reuse levels must lie in [0, 1]"),
    ("load --url http://h --reuse a,b", "not a comma-separated list"),
    ("load --url http://h --requests 0", "must be at least 1"),
    ("load --url http://h --requests 100001", "must be at most 100000"),
    ("load --url http://h --requests 100000 --images-per-request 11", "1,000,000 images"),
    ("load --url http://h --images-per-request 0", "must be at least 1"),
    ("load --url http://h --images-per-request 257", "must be at most 256"),
    ("load --url http://h --concurrency 0", "must be at least 1"),
    ("load --url http://h --concurrency 10001", "must be at most 10000"),
    ("load --url http://h --image-size 0x10", "image sides must lie in 1..4096"),
    ("load --url http://h --image-size 32", "expected WIDTHxHEIGHT"),
    ("load --url http://h --seed -1", "must be at least 0"),
    ("load --url http://h --max-tokens 0", "must be at least 1"),
    ("load --url http://h --max-tokens 2147483648", "must be at most 2147483647"),
    ("load --url http://h --timeout 0", "must be positive"),
    ("load --url http://h --timeout inf", "must be at most 604800 s"),
    ("load --url http://h --request-timeout nan", "must be positive"),
    ("load --url http://h --request-timeout 1e308", "must be at most 604800 s"),
    ("load --url http://h --plot {file}/sweep.png", "cannot create a file in {file}"),
    # load's media: sources, durations, and what only the media server of --media http sets
    ("load --url http://h --media ftp", "choose from data_url, http (comma-separated)"),
    ("load --url http://h --media ,", "choose from data_url, http"),
    ("load --url http://h --media http --media-latency 200", "must be at most 60 s"),  # seconds
    ("load --url http://h --media http --media-latency 61s", "must be at most 60 s"),
    ("load --url http://h --media http --media-latency 2 ms", "unrecognized arguments: ms"),
    ("load --url http://h --media http --media-latency=-5ms", "expected a duration such as"),
    ("load --url http://h --media http --media-latency 5min", "expected a duration such as"),
    ("load --url http://h --media-latency 200ms", "--media-latency needs --media http"),
    ("load --url http://h --media-vary-urls", "--media-vary-urls needs --media http"),
    ("load --url http://127.0.0.1:9 --media http --media-latency 10ms --media-jitter 20ms",
     "--media-jitter 20ms is more than --media-latency 10ms"),
    ("load --url http://h --media data_url,http", "must be a server on this machine"),
    ("load --url http://h --media-format gif", "invalid choice: 'gif'"),
    ("load --url http://h --plot /proc/sweep.png", "cannot create a file in /proc"),
    ("load --url http://h --plot {tmp}", "is a directory"),
    ("load --url http://h --plot {tmp}/sweep.bmpx", "must end in one of .png, .svg, .pdf"),
    # load over a fleet: URLs, shards, Prometheus and its matcher
    ("load --url http://h --url http://h/v1", "--url http://h is given twice"),
    ("load --url http://h --url http://g --encoder-url http://e", "pairs with one --url"),
    ("load --url http://h --shard 3/2", "K/N needs 1 <= K <= N"),
    ("load --url http://h --shard 0/2", "K/N needs 1 <= K <= N"),
    ("load --url http://h --shard 1:2", "expected K/N"),
    ("load --url http://h --shard 1/2", "--shard needs --seed"),
    ("load --url http://h --prometheus-match '{{job=\"v\"}}'", "needs --prometheus"),
    ("load --url http://h --prometheus http://p --prometheus-match job=v",
     "a label matcher in braces"),
    ("load --url http://h --prometheus p:9090", "--prometheus must start with http://"),
    ("load --url http://h --prometheus http://127.0.0.1:{port}",
     "cannot reach Prometheus at http://127.0.0.1:{port}"),
    # cache-size
    ("cache-size {tmp}/missing.log", "no such file"),
    ("cache-size {tmp}", "is a directory"),
    ("cache-size {file}", "not an encoder-cache access log"),
    ("cache-size {log} --target-hit-rate 1.5", "a target hit rate is above 0 and at most 1"),
    ("cache-size {log} --target-hit-rate 0", "a target hit rate is above 0 and at most 1"),
    ("cache-size {log} --target-hit-rate nan", "a target hit rate is above 0 and at most 1"),
    ("cache-size {log} --target-hit-rate x", "--target-hit-rate"),
    ("cache-size {log} --hidden-size 0", "not a width between 1 and 1048576"),
    ("cache-size {log} --hidden-size 1048577", "not a width between 1 and 1048576"),
    ("cache-size {log} --capacities 8", "below the largest item"),
    ("cache-size {log} --capacities -5", "below the largest item"),
    ("cache-size {log} --capacities 4611686018427387905", "above the largest capacity"),
    ("cache-size {log} --capacities 1e3", "not a whole number"),
    ("cache-size {log} --capacities ,", "no capacity given"),
    ("cache-size {log} --dtype int8", "--dtype"),
    ("cache-size {log} --release never", "--release"),
    ("cache-size {log} --plot {file}/curve.png", "cannot create a file in {file}"),
    ("cache-size {log} --plot /proc/curve.png", "cannot create a file in /proc"),
    ("cache-size {log} --plot {tmp}/curve.bmpx", "must end in one of .png, .svg, .pdf"),
]


def mmscope(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmscope.cli", *argv], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    from tests.kit import nsys

    base = tmp_path_factory.mktemp("bad-input")
    plain = base / "a-file"
    plain.write_text("not a folder, not a log\n")
    log = base / "access.log"
    log.write_text(access_log.HEADER + "C\t0\t1\t64\n"
                   "A\t1\t1\tr1\t0\timage\tk\t16\tMISS\t-\nF\t2\t1\tr1\n"
                   "A\t3\t1\tr2\t0\timage\tk\t16\tHIT\tlocal\nF\t4\t1\tr2\n")
    profile = nsys.pipeline_file(base / "p.sqlite")
    other = base / "other-metrics.txt"
    other.write_text("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n")
    return {"file": str(plain), "log": str(log), "profile": profile, "port": str(free_port()),
            "othermetrics": str(other), **damaged_profiles(base, profile), **servers()}


def servers() -> dict[str, str]:
    """Loopback servers that answer badly, each in daemon threads of this process."""
    import random
    import threading
    import time

    noise = bytes(random.Random(0).randrange(256) for _ in range(220))
    page = noise[:200]

    def junk(conn):
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                     + str(len(page)).encode() + b"\r\n\r\n" + page)
        conn.close()

    def noisy(conn):
        conn.recv(65536)
        conn.sendall(noise)
        conn.close()

    def silent(conn):
        time.sleep(120)
        conn.close()

    def serve(handle) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)

        def accept():
            while True:
                conn, _ = sock.accept()
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return str(sock.getsockname()[1])

    return {"junkport": serve(junk), "noiseport": serve(noisy), "silentport": serve(silent)}


def damaged_profiles(base, profile: str) -> dict[str, str]:
    """A valid export broken two ways (bytes flipped in its schema page; a name whose bytes are
    no UTF-8), and one whose NVTX table is empty."""
    import random

    from tests.kit import nsys

    data = open(profile, "rb").read()
    flipped = bytearray(data)
    rng = random.Random(0)
    for at in rng.sample(range(100, 4096), 200):  # past the 100-byte header, in page 1
        flipped[at] ^= 0xFF
    name = b"gpu_model_runner: preprocess"
    assert name in data
    paths = {"corrupt": base / "corrupt.sqlite", "badtext": base / "badtext.sqlite",
             "nonvtx": base / "empty-nvtx.sqlite"}
    paths["corrupt"].write_bytes(bytes(flipped))
    paths["badtext"].write_bytes(data.replace(name, b"\xff\xfe" + name[2:]))
    nsys.NsysFile(paths["nonvtx"]).close()
    return {k: str(v) for k, v in paths.items()}


def assert_one_line_error(done: subprocess.CompletedProcess, fragment: str) -> None:
    err = done.stderr
    assert done.returncode != 0, f"exit 0 for bad input; stdout: {done.stdout[-500:]!r}"
    assert "Traceback" not in err, err[-3000:]
    lines = err.splitlines()
    if lines and lines[0].startswith("usage: mmscope"):  # argparse: usage, then one error line
        assert done.returncode == 2
        errors = [ln for ln in lines if ARGPARSE_ERROR.match(ln)]
        assert errors == lines[-1:], err
    else:
        assert len(lines) == 1 and lines[0].startswith("mmscope: error: "), err
    assert fragment in lines[-1], lines[-1]
    assert lines[-1].isprintable(), lines[-1]  # nothing a server sent is echoed raw
    assert done.stdout == ""


@pytest.mark.parametrize("argv,fragment", ROWS, ids=[argv for argv, _ in ROWS])
def test_bad_input_is_one_line(argv, fragment, places, tmp_path):
    fill = {**places, "tmp": str(tmp_path)}
    done = mmscope(*[part.format(**fill) for part in shlex.split(argv)],
                   cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})
    assert_one_line_error(done, fragment.format(**fill))
    assert not (tmp_path / "missing").exists()  # no command makes the folders above a path


def test_every_command_has_bad_input_rows():
    from mmscope.cli import COMMANDS

    assert {argv.split()[0] for argv, _ in ROWS} == set(COMMANDS)


@pytest.mark.parametrize("argv", ["analyze --json --no-cache {profile}",
                                  "compare --json --no-cache {profile} {profile}",
                                  "cache-size --json {log}"])
def test_a_reader_that_leaves_early_ends_the_command_quietly(argv, places):
    """`mmscope ... | head`: the pipe's reading end is closed before the command writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "mmscope.cli",
                               *[p.format(**places) for p in shlex.split(argv)]],
                              stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=RUN_TIMEOUT_S)
    finally:
        os.close(write_end)
    assert done.returncode == PIPE_CLOSED_EXIT and done.stderr == ""
