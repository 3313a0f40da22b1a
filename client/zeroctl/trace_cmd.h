/* zeroctl's step trace (trace_cmd.c): `zeroctl trace`, a Chrome / Perfetto trace of a job's last
 * steps on every daemon asked (docs/trace.md). */
#ifndef ZEROCTL_TRACE_CMD_H
#define ZEROCTL_TRACE_CMD_H

/* argv[0] is "trace"; json: --json was given before it; socket_path: a -s given before it (NULL:
 * none); timeout_ms: a --timeout given before it (0: none). Returns the exit status. */
int zeroctl_trace_main(int argc, char **argv, int json, const char *socket_path, int timeout_ms);

#endif
