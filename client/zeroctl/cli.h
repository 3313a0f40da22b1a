/*
 * What every zeroctl command shares (cli.c): exit codes, the JSON output and its error object,
 * usage errors from getopt, and the daemon sockets of a directory.
 *
 * Errors: a command reports each with zctl_error() (a line "zeroctl: MESSAGE" on stderr).
 * main() ends every command with zctl_finish(): under --json, a command that failed
 * without printing its JSON output prints instead
 *
 *   {"schema_version": 1, "command": "status", "error": {"status": "ERR_UNREACHABLE",
 *    "message": "connect(/run/zerod/zerod-cpu0.sock): No such file or directory ..."}}
 *
 * on stdout (the first error reported; "command" null when the command line named none), and
 * the exit code is kept.
 */
#ifndef ZEROCTL_CLI_H
#define ZEROCTL_CLI_H

#include <cjson/cJSON.h>
#include <stdio.h>

#define ZCTL_SCHEMA_VERSION 1
#define ZCTL_MAX_DAEMONS    256 /* sockets asked at once (-s, or those of a directory) */
#define ZCTL_SOCKET_MAX     108 /* sizeof(sockaddr_un.sun_path) */

/* Exit codes, the same for every command: 0 ok, 1 the daemon returned an error, 2 usage, 7 the
 * daemon unreachable. */
enum {
    ZCTL_EXIT_OK = 0,
    ZCTL_EXIT_DAEMON = 1,
    ZCTL_EXIT_USAGE = 2,
    ZCTL_EXIT_UNREACHABLE = 7,
};

/* --json was given (anywhere on the command line): zctl_finish() answers in JSON. */
void zctl_set_json(int json);
/* The command's name in the JSON output ("status", "job ls"); a string that outlives main. */
void zctl_set_command(const char *command);

/* Report an error: "zeroctl: MESSAGE" on stderr; the first one is kept for zctl_finish().
 * status: a ZC_* code (zc_status_name() names it in the JSON). */
void zctl_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* zctl_error(), then under --json the error object on stdout at once (on one line with
 * compact: a frame of `status -l`). */
void zctl_error_json(int compact, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A usage error: zctl_error(ZC_ERR_INVALID, ...) and "Try 'HELP'." on stderr; returns
 * ZCTL_EXIT_USAGE. */
int zctl_usage_error(const char *help, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* getopt_long returned '?' or ':' (opterr 0, optstring starting with ':'): report it, naming the
 * option; returns ZCTL_EXIT_USAGE. */
int zctl_getopt_error(int c, char **argv, const char *help);

/* The exit code of a failed libzc call: 7 unreachable (nothing listens, permission), else 1. */
int zctl_exit_of(int status);

/* Print root (pretty, or on one line with compact) on stdout and free it; ZCTL_EXIT_OK, or
 * ZCTL_EXIT_DAEMON when it could not be built (root NULL) or printed. The output counts as the
 * command's JSON answer: zctl_finish() adds no error object. */
int zctl_print_json(cJSON *root, int compact);
/* A new object with "schema_version" and "command". */
cJSON *zctl_json_root(const char *command);
/* {"status": NAME, "message": msg}, as the error objects of the JSON output. */
cJSON *zctl_json_error(int status, const char *msg);

/* The end of main(): under --json, a failure (rc != 0) without JSON output prints the error
 * object. Returns rc. */
int zctl_finish(int rc);

/* The sockets of the daemons of a directory: every socket file in dir but the daemons' metrics
 * sockets (`*.metrics.sock`, metrics_listen = auto), sorted by name, at most max, into sockets
 * (each ZCTL_SOCKET_MAX bytes). The count, or -1 with errno when dir cannot be read. */
int zctl_scan_dir(const char *dir, char (*sockets)[ZCTL_SOCKET_MAX], int max);
/* The directory zeroctl asks by default: that of $ZEROD_SOCKET when use_env and it is set, else
 * /run/zerod; into buf. */
const char *zctl_default_dir(int use_env, char *buf, size_t len);

#endif
