/*
 * The training-config key table printed (`zerod --print-training-keys`, and the key
 * table of docs/training-config.md, which `update-docs` writes from it): each key's type,
 * default, allowed values, what zerod does with it and what it means.
 */
#include "config/train_config.h"
#include "config/train_config_int.h"
#include "config/train_config_keys.h"

#include <stdio.h>
#include <string.h>

#define ZD_TC_N_KEYS zd_tc_n_keys

/* ---- printing the table ------------------------------------------------------------------- */

static const char *zd_tc_type_name(const zd_tc_key_t *k)
{
    static const char *const names[] = {"object", "bool",   "int",
                                        "number", "string", "[number, number]"};

    return names[k->type];
}

/* The values a key takes: "[1, 1e+15]", "`\"mean\"`, `\"sum\"`" (md: each in backticks). */
static void zd_tc_allowed(const zd_tc_key_t *k, bool md, char *buf, size_t len)
{
    const char *tick = md ? "`" : "";
    size_t used = 0;

    buf[0] = '\0';
    if (k->fate == ZD_TC_REFUSED && k->def != NULL) {
        snprintf(buf, len, "only %s%s%s", tick, k->def, tick);
        return;
    }
    if (k->fate != ZD_TC_HONOURED || k->type == ZD_TC_OBJECT || k->type == ZD_TC_BOOL) {
        return;
    }
    if (k->choices != NULL) {
        for (const zd_tc_choice_t *c = k->choices; c->name != NULL && used < len; c++) {
            const char *q = k->type == ZD_TC_ENUM ? "\"" : "";
            if (c->refused == NULL) {
                used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s%s%s",
                                         used > 0 ? ", " : "", tick, q, c->name, q, tick);
            }
        }
        return;
    }
    snprintf(buf, len, "%s%s%s%.10g, %.10g%s%s", k->type == ZD_TC_PAIR ? "each in " : "", tick,
             (k->flags & ZD_TC_MIN_OPEN) ? "(" : "[", k->min, k->max,
             (k->flags & ZD_TC_MAX_OPEN) ? ")" : "]", tick);
}

/* The doc, then the refused choices with their reasons. */
static void zd_tc_meaning(const zd_tc_key_t *k, bool md, char *buf, size_t len)
{
    const char *tick = md ? "`" : "";
    size_t used = (size_t)snprintf(buf, len, "%s", k->doc);
    const char *sep = ". Refused: ";

    for (const zd_tc_choice_t *c = k->choices; c != NULL && c->name != NULL && used < len; c++) {
        const char *q = k->type == ZD_TC_ENUM ? "\"" : "";
        if (c->refused != NULL) {
            used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s%s%s (%s)", sep, tick, q,
                                     c->name, q, tick, c->refused);
            sep = "; ";
        }
    }
}

/* The default, NULL when none (an alias's def is the section it names). */
static const char *zd_tc_default(const zd_tc_key_t *k)
{
    return (k->flags & ZD_TC_ALIAS) ? NULL : k->def;
}

static const char *zd_tc_fate_name(const zd_tc_key_t *k)
{
    static const char *const names[] = {"honoured", "ignored", "refused"};

    return names[k->fate];
}

void zd_train_config_print_keys(FILE *out, zd_train_config_format_t fmt)
{
    char allowed[256], meaning[1024], def[64];
    bool md = fmt == ZD_TC_FORMAT_MARKDOWN;

    if (md) {
        fprintf(out, "| key | type | default | allowed | zerod | meaning |\n"
                     "|---|---|---|---|---|---|\n");
    }
    for (size_t i = 1; i < ZD_TC_N_KEYS; i++) { /* row 0 is the root */
        const zd_tc_key_t *k = &zd_tc_keys[i];
        zd_tc_allowed(k, md, allowed, sizeof(allowed));
        zd_tc_meaning(k, md, meaning, sizeof(meaning));
        if (md) {
            snprintf(def, sizeof(def), "%s%s%s", zd_tc_default(k) != NULL ? "`" : "",
                     zd_tc_default(k) != NULL ? k->def : "", zd_tc_default(k) != NULL ? "`" : "");
            fprintf(out, "| `%s` | %s | %s | %s | %s | %s |\n", k->path, zd_tc_type_name(k), def,
                    allowed, zd_tc_fate_name(k), meaning);
        } else {
            fprintf(out, "%-44s %-16s %-13s %s\n    %s\n", k->path, zd_tc_type_name(k),
                    zd_tc_default(k) != NULL ? k->def : "-",
                    k->fate != ZD_TC_HONOURED ? zd_tc_fate_name(k) : allowed, meaning);
        }
    }
}
