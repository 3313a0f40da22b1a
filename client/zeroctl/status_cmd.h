/* `zeroctl status` (status_cmd.c): one daemon, or every daemon of the host as one table. */
#ifndef ZEROCTL_STATUS_CMD_H
#define ZEROCTL_STATUS_CMD_H

typedef struct zeroctl_status_opts {
    const char *socket_path; /* -s; NULL: $ZEROD_SOCKET (one daemon), else every daemon of dir */
    const char *dir;         /* --dir: every daemon of DIR even with $ZEROD_SOCKET set */
    int json;
    int timeout_ms; /* -t; 0: not given (one daemon: 10000; the host table: 5000 each) */
    int loop_s;     /* -l: redraw every loop_s seconds until SIGINT or SIGTERM; 0: once */
} zeroctl_status_opts_t;

/* The exit status: 0 ok; one daemon: 1 it returned an error, 7 unreachable; the host table: 7
 * when a daemon was unreachable (or the directory holds none), else 1 when one failed. */
int zeroctl_status_main(const zeroctl_status_opts_t *o);

#endif
