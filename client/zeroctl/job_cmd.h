/* zeroctl's commands on the daemons' jobs (job_cmd.c): `zeroctl job ls`, `zeroctl job end`. */
#ifndef ZEROCTL_JOB_CMD_H
#define ZEROCTL_JOB_CMD_H

/* argv[0] is "job"; json: --json was given before it; socket_path: a -s given before it (NULL:
 * none); timeout_ms: a --timeout given before it (0: none). Returns the exit status. */
int zeroctl_job_main(int argc, char **argv, int json, const char *socket_path, int timeout_ms);

#endif
