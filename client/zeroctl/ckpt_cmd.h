/* zeroctl's commands on checkpoint directories (ckpt_cmd.c). */
#ifndef ZEROCTL_CKPT_CMD_H
#define ZEROCTL_CKPT_CMD_H

/* argv[0] is "checkpoint" or "export"; json: --json was given before it; socket_path (NULL:
 * the default) and timeout_ms: for `export` of a live job. Returns the exit status. */
int zeroctl_checkpoint_main(int argc, char **argv, int json, const char *socket_path,
                            int timeout_ms);

#endif
