/*
 * The key table's navigation (config/train_config_keys.c holds the table) and what an unknown key
 * is told: the closest known key, or the keys that are known there. Calls nothing else of
 * config/.
 */
#include "config/train_config_int.h"
#include "config/train_config_keys.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define ZD_TC_N_KEYS zd_tc_n_keys

const char *zd_tc_leaf(const zd_tc_key_t *k)
{
    const char *dot = strrchr(k->path, '.');

    return dot != NULL ? dot + 1 : k->path;
}

/* Is k a direct child of parent ("" is the root)? */
bool zd_tc_is_child(const zd_tc_key_t *parent, const zd_tc_key_t *k)
{
    size_t plen = strlen(parent->path);
    const char *rest = k->path;

    if (k == parent || k->path[0] == '\0') {
        return false;
    }
    if (plen > 0) {
        if (strncmp(k->path, parent->path, plen) != 0 || k->path[plen] != '.') {
            return false;
        }
        rest = k->path + plen + 1;
    }
    return strchr(rest, '.') == NULL;
}

const zd_tc_key_t *zd_tc_child(const zd_tc_key_t *parent, const char *name)
{
    for (size_t i = 0; i < ZD_TC_N_KEYS; i++) {
        if (zd_tc_is_child(parent, &zd_tc_keys[i]) &&
            strcmp(zd_tc_leaf(&zd_tc_keys[i]), name) == 0) {
            return &zd_tc_keys[i];
        }
    }
    return NULL;
}

const zd_tc_key_t *zd_tc_find(const char *path)
{
    for (size_t i = 0; i < ZD_TC_N_KEYS; i++) {
        if (strcmp(zd_tc_keys[i].path, path) == 0) {
            return &zd_tc_keys[i];
        }
    }
    return NULL;
}

/* `shown` "." `name`, the name as printable ASCII (a client's key must not forge a log line). */
void zd_tc_join(char *buf, size_t len, const char *shown, const char *name)
{
    size_t n = (size_t)snprintf(buf, len, "%s%s", shown, shown[0] != '\0' ? "." : "");

    for (const unsigned char *p = (const unsigned char *)name; *p != '\0' && n + 5 < len; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '\'' && *p != '\\') {
            buf[n++] = (char)*p;
        } else {
            n += (size_t)snprintf(buf + n, len - n, "\\x%02x", *p);
        }
    }
    buf[n < len ? n : len - 1] = '\0';
}

/* Optimal string alignment distance, ignoring case; anything over `cap` is cap + 1. */
static size_t zd_tc_distance(const char *a, const char *b, size_t cap)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t d[3][65], *prev2 = d[0], *prev = d[1], *cur = d[2];

    if (la > 64 || lb > 64 || (la > lb ? la - lb : lb - la) > cap) {
        return cap + 1;
    }
    for (size_t j = 0; j <= lb; j++) {
        prev[j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t best = prev[j - 1] + (ca != cb);
            best = prev[j] + 1 < best ? prev[j] + 1 : best;
            best = cur[j - 1] + 1 < best ? cur[j - 1] + 1 : best;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && prev2[j - 2] + 1 < best) {
                best = prev2[j - 2] + 1;
            }
            cur[j] = best;
        }
        size_t *t = prev2;
        prev2 = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb] <= cap ? prev[lb] : cap + 1;
}

/* A hint for an unknown key `name` under `parent`: "; did you mean 'fp16.loss_scale'?" for a
 * sibling one or two edits away, or "; 'stage' is a key of 'zero_optimization'" for a known key
 * of another section. "" when nothing is close. Under an open object only keys zerod uses count
 * (a typo of an ignored key changes nothing). */
void zd_tc_suggest(const zd_tc_key_t *parent, const char *shown_parent, const char *name, char *buf,
                   size_t len)
{
    size_t cap = strlen(name) <= 4 ? 1 : 2, best_d = cap + 1;
    const zd_tc_key_t *best = NULL;
    bool used_only = (parent->flags & ZD_TC_OPEN) != 0;
    char path[ZD_TC_PATHLEN];

    buf[0] = '\0';
    for (size_t i = 0; i < ZD_TC_N_KEYS; i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        size_t d;
        if (!zd_tc_is_child(parent, k) || (used_only && k->fate == ZD_TC_IGNORED)) {
            continue;
        }
        d = zd_tc_distance(name, zd_tc_leaf(k), cap);
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    if (best != NULL) {
        zd_tc_join(path, sizeof(path), shown_parent, zd_tc_leaf(best));
        snprintf(buf, len, "; did you mean '%s'?", path);
        return;
    }
    for (size_t i = 0; i < ZD_TC_N_KEYS; i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        if (strchr(k->path, '.') != NULL && strcasecmp(zd_tc_leaf(k), name) == 0 &&
            !(used_only && k->fate == ZD_TC_IGNORED)) {
            snprintf(buf, len, "; '%s' is a key of '%.*s'", zd_tc_leaf(k),
                     (int)(zd_tc_leaf(k) - 1 - k->path), k->path);
            return;
        }
    }
}

/* " (known keys of 'optimizer.params': lr, betas, ...)" */
void zd_tc_known(const zd_tc_key_t *parent, const char *shown_parent, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, " (known keys of '%s':", shown_parent);
    const char *sep = " ";

    for (size_t i = 0; i < ZD_TC_N_KEYS && used < len; i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        if (zd_tc_is_child(parent, k) && k->fate != ZD_TC_REFUSED) {
            used += (size_t)snprintf(buf + used, len - used, "%s%s", sep, zd_tc_leaf(k));
            sep = ", ";
        }
    }
    if (used < len) {
        snprintf(buf + used, len - used, ")");
    }
}
