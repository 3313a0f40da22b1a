/* The key tables of docs/training-config.md and docs/daemon-config.md are generated from the
 * config tables (daemon/src/config/train_config_keys.c, daemon/src/config/daemon_config.c), between
 * the lines
 *   <!-- BEGIN GENERATED: <name> ... -->   and   <!-- END GENERATED -->
 * A stale table fails here. ZEROD_UPDATE_DOCS=1 rewrites it instead:
 *   cmake --build <build dir> --target update-docs */
#define _GNU_SOURCE /* open_memstream */
#include "config/daemon_config.h"
#include "config/train_config.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ZD_SOURCE_DIR
#error "ZD_SOURCE_DIR: the source tree, set by tests/CMakeLists.txt"
#endif

#define DOC_BEGIN "<!-- BEGIN GENERATED: "
#define DOC_END   "<!-- END GENERATED -->\n"

static void print_train_keys(FILE *out)
{
    zd_train_config_print_keys(out, ZD_TC_FORMAT_MARKDOWN);
}

/* zerod.conf keys, as `zerod --help` lists them: also --<key-with-dashes> and ZEROD_<KEY>. */
static void print_daemon_keys(FILE *out)
{
    fprintf(out, "| key | type | default | allowed | SIGHUP | meaning |\n"
                 "|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < zd_config_table.n_rows; i++) {
        const zs_config_row_t *row = &zd_config_table.rows[i];
        char allowed[256];

        zs_config_allowed(row, allowed, sizeof(allowed));
        fprintf(out, "| `%s` | %s | %s%s%s | %s | %s | %s |\n", row->name, row->parser->name,
                row->def[0] != '\0' ? "`" : "", row->def, row->def[0] != '\0' ? "`" : "", allowed,
                (row->flags & ZS_CONFIG_RELOAD) ? "reloaded" : "", row->doc);
    }
}

static char *render(void (*print)(FILE *))
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);

    cr_assert_not_null(out);
    print(out);
    fclose(out);
    return text;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *text;
    long len;

    cr_assert_not_null(f, "%s: %m", path);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = calloc(1, (size_t)len + 1);
    cr_assert_not_null(text);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

/* The first line where a and b differ, for the message. */
static void first_difference(const char *a, const char *b, char *buf, size_t len)
{
    size_t line = 1, i = 0;
    const char *sa = a, *sb = b;

    while (a[i] != '\0' && a[i] == b[i]) {
        if (a[i++] == '\n') {
            line++;
            sa = a + i;
            sb = b + i;
        }
    }
    snprintf(buf, len, "line %zu of the table:\n  doc:  %.*s\n  code: %.*s", line,
             (int)strcspn(sa, "\n"), sa, (int)strcspn(sb, "\n"), sb);
}

static void write_doc(const char *path, const char *head, size_t head_len, const char *table,
                      const char *tail)
{
    char real[PATH_MAX], tmp[PATH_MAX + 8];
    FILE *f;

    cr_assert_not_null(realpath(path, real), "%s: %m", path); /* rename a link's target */
    path = real;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    cr_assert_not_null(f, "%s: %m", tmp);
    fprintf(f, "%.*s%s%s", (int)head_len, head, table, tail);
    cr_assert_eq(fclose(f), 0, "%s: %m", tmp);
    cr_assert_eq(rename(tmp, path), 0, "%s: %m", path);
}

/* Compare the block `name` of docs/<doc> with print's output; rewrite it on request. */
static void check_block(const char *doc, const char *name, void (*print)(FILE *))
{
    char path[4096], marker[256], diff[1024];
    char *text, *table = render(print), *begin, *body, *end;

    snprintf(path, sizeof(path), "%s/docs/%s", ZD_SOURCE_DIR, doc);
    snprintf(marker, sizeof(marker), DOC_BEGIN "%s", name);
    text = slurp(path);
    begin = strstr(text, marker);
    cr_assert_not_null(begin, "%s has no line '%s ...'", path, marker);
    body = strchr(begin, '\n');
    cr_assert_not_null(body);
    body++;
    end = strstr(body, DOC_END);
    cr_assert_not_null(end, "%s: '%s' has no '%.22s' after it", path, marker, DOC_END);
    if ((size_t)(end - body) != strlen(table) || strncmp(body, table, strlen(table)) != 0) {
        if (getenv("ZEROD_UPDATE_DOCS") != NULL) {
            write_doc(path, text, (size_t)(body - text), table, end);
            fprintf(stderr, "rewrote the table '%s' of %s\n", name, path);
        } else {
            first_difference(body, table, diff, sizeof(diff));
            cr_assert_fail(
                "docs/%s is stale (table '%s'); rebuild it with `cmake --build <build dir> "
                "--target update-docs`. First difference at %s",
                doc, name, diff);
        }
    }
    free(text);
    free(table);
}

Test(zd_config_docs, training_table_is_that_of_the_code)
{
    check_block("training-config.md", "zd_train_config_print_keys", print_train_keys);
}

Test(zd_config_docs, daemon_table_is_that_of_the_code)
{
    check_block("daemon-config.md", "zd_config_table", print_daemon_keys);
}
