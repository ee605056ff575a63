/* Batch boundaries for plugin_instructions.py: Callgrind counts only between mark_start() and
 * mark_dump(label), one dump per batch. Outside Valgrind each call is a no-op of a few instructions.
 * Built by the script with the system's cc against Valgrind's callgrind.h (package valgrind). */
#include <valgrind/callgrind.h>

void mark_start(void) {
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
}

void mark_dump(const char *label) {
    CALLGRIND_DUMP_STATS_AT(label);
    CALLGRIND_STOP_INSTRUMENTATION;
}
