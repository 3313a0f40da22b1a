/*
 * What every zeroctl command shares: exit codes, the JSON output and its error object, usage
 * errors, the daemon sockets of a directory (cli.h).
 */
#define _GNU_SOURCE
#include "cli.h"

#include "zerod/zc.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* zeroctl is one thread when it reports (a query thread only fills its own row). */
static struct {
    int json;
    const char *command;
    int printed; /* the command's JSON answer is out */
    int have_error;
    int status;
    char message[1024];
} zctl_out;

void zctl_set_json(int json)
{
    zctl_out.json = json ? 1 : zctl_out.json;
}

void zctl_set_command(const char *command)
{
    zctl_out.command = command;
}

static void zctl_verror(int status, const char *fmt, va_list ap)
{
    char msg[sizeof(zctl_out.message)];

    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "zeroctl: %s\n", msg);
    if (!zctl_out.have_error) {
        zctl_out.have_error = 1;
        zctl_out.status = status;
        memcpy(zctl_out.message, msg, sizeof(msg));
    }
}

void zctl_error(int status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    zctl_verror(status, fmt, ap);
    va_end(ap);
}

void zctl_error_json(int compact, int status, const char *fmt, ...)
{
    char msg[sizeof(zctl_out.message)];
    cJSON *root;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    zctl_error(status, "%s", msg);
    if (zctl_out.json) {
        root = zctl_json_root(zctl_out.command);
        cJSON_AddItemToObject(root, "error", zctl_json_error(status, msg));
        (void)zctl_print_json(root, compact);
    }
}

int zctl_usage_error(const char *help, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    zctl_verror(ZC_ERR_INVALID, fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try '%s'.\n", help);
    return ZCTL_EXIT_USAGE;
}

int zctl_getopt_error(int c, char **argv, const char *help)
{
    const char *word = optind > 0 ? argv[optind - 1] : "";
    char name[128];

    /* a long option is its word ("--frob", "--json=1" as "--json"); a short one its letter
     * (it may sit inside a group, "-jx") */
    if (strncmp(word, "--", 2) == 0) {
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(word, "="), word);
    } else if (optopt != 0) {
        snprintf(name, sizeof(name), "-%c", optopt);
    } else {
        snprintf(name, sizeof(name), "%s", word);
    }
    if (c == ':') {
        return zctl_usage_error(help, "option '%s' needs an argument", name);
    }
    return zctl_usage_error(help, "unknown option '%s'", name);
}

int zctl_exit_of(int status)
{
    if (status == ZC_ERR_UNREACHABLE || status == ZC_ERR_PERMISSION) {
        return ZCTL_EXIT_UNREACHABLE;
    }
    return status == ZC_OK ? ZCTL_EXIT_OK : ZCTL_EXIT_DAEMON;
}

int zctl_print_json(cJSON *root, int compact)
{
    char *text = NULL;

    if (root != NULL) {
        text = compact ? cJSON_PrintUnformatted(root) : cJSON_Print(root);
        cJSON_Delete(root);
    }
    if (text == NULL) {
        zctl_error(ZC_ERR_NO_MEMORY, "out of memory building the JSON output");
        return ZCTL_EXIT_DAEMON;
    }
    printf("%s\n", text);
    cJSON_free(text);
    zctl_out.printed = 1;
    return ZCTL_EXIT_OK;
}

cJSON *zctl_json_root(const char *command)
{
    cJSON *root = cJSON_CreateObject();

    cJSON_AddNumberToObject(root, "schema_version", ZCTL_SCHEMA_VERSION);
    if (command != NULL) {
        cJSON_AddStringToObject(root, "command", command);
    } else {
        cJSON_AddNullToObject(root, "command");
    }
    return root;
}

cJSON *zctl_json_error(int status, const char *msg)
{
    cJSON *e = cJSON_CreateObject();

    cJSON_AddStringToObject(e, "status", zc_status_name(status));
    cJSON_AddStringToObject(e, "message", msg);
    return e;
}

int zctl_finish(int rc)
{
    cJSON *root;
    int status = zctl_out.status;

    if (!zctl_out.json || rc == ZCTL_EXIT_OK || zctl_out.printed) {
        return rc;
    }
    if (!zctl_out.have_error) { /* a path that reported nothing: name the exit code at least */
        status = rc == ZCTL_EXIT_USAGE         ? ZC_ERR_INVALID
                 : rc == ZCTL_EXIT_UNREACHABLE ? ZC_ERR_UNREACHABLE
                                               : ZC_ERR_IO;
        snprintf(zctl_out.message, sizeof(zctl_out.message), "failed (exit code %d)", rc);
    }
    root = zctl_json_root(zctl_out.command);
    cJSON_AddItemToObject(root, "error", zctl_json_error(status, zctl_out.message));
    (void)zctl_print_json(root, 0);
    return rc;
}

static int zctl_by_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* A daemon's metrics socket (HTTP, not the daemon protocol): the name metrics_listen = auto
 * gives it beside the daemon socket (daemon/src/metrics.h, ZD_METRICS_SOCK_SUFFIX). */
static bool zctl_is_metrics_sock(const char *name)
{
    static const char suffix[] = ".metrics.sock";
    size_t n = strlen(name), k = sizeof(suffix) - 1;

    return n > k && strcmp(name + n - k, suffix) == 0;
}

int zctl_scan_dir(const char *dir, char (*sockets)[ZCTL_SOCKET_MAX], int max)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    struct stat sb;
    int n = 0;

    if (dp == NULL) {
        return -1;
    }
    while ((e = readdir(dp)) != NULL && n < max) {
        char path[4096];
        int len = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= ZCTL_SOCKET_MAX || zctl_is_metrics_sock(e->d_name) ||
            stat(path, &sb) != 0 || !S_ISSOCK(sb.st_mode)) {
            continue;
        }
        memcpy(sockets[n++], path, (size_t)len + 1); /* it fits: checked above */
    }
    closedir(dp);
    qsort(sockets, (size_t)n, sizeof(*sockets), zctl_by_name);
    return n;
}

const char *zctl_default_dir(int use_env, char *buf, size_t len)
{
    const char *env = use_env ? getenv("ZEROD_SOCKET") : NULL;

    snprintf(buf, len, "%s", env != NULL && env[0] != '\0' ? env : "/run/zerod/x");
    return dirname(buf);
}
