/* config_where.c - where a handler's configuration value was written:
 * the file:line:column of a byte of a value, followed through quotes,
 * escapes and block scalars, and the few queue settings a handler's
 * check() may read (host->config_where(), host->config_queue()). The
 * loader records the marks (config_queues.c mark_config()); this file reads them,
 * only while the plugin loader has named a snapshot. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <yaml.h>

#include "config.h"

static const struct sk_conf *where_conf;

/* Follows the value as written up to its byte `offset`: quotes, escapes
 * and line breaks take more room in the file than in the value. */
static void walk_mark(const struct sk_conf_mark *m, size_t offset, uint32_t *line,
                      uint32_t *column)
{
    const char *s = m->raw;
    bool dq = m->style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
    bool sq = m->style == YAML_SINGLE_QUOTED_SCALAR_STYLE;
    bool block = m->style == YAML_LITERAL_SCALAR_STYLE || m->style == YAML_FOLDED_SCALAR_STYLE;
    uint32_t l = m->line, c = m->column;
    size_t i = 0, v = 0;

    if (dq || sq) {
        i = 1;
        c++;
    } else if (block) {  /* the text starts below the indicator, indented */
        while (s[i] != '\0' && s[i] != '\n')
            i++;
        if (s[i] == '\n')
            i++;
        l++;
        c = 1;
        for (uint32_t k = 1; k < m->indent && s[i] == ' '; k++, i++)
            c++;
    }
    while (s[i] != '\0' && v < offset) {
        if (s[i] == '\n') {
            l++;
            c = 1;
            i++;
            for (uint32_t k = 1; s[i] == ' ' && (!block || k < m->indent); k++, i++)
                c++;
            v++;
            continue;
        }
        size_t adv = 1, made = 1;
        if (dq && s[i] == '\\') {
            switch (s[i + 1]) {
            case 'x': adv = 4; break;
            case 'u': adv = 6; made = 3; break;  /* a code point's UTF-8, most often 3 */
            case 'U': adv = 10; made = 4; break;
            default:  adv = 2; break;
            }
        } else if (sq && s[i] == '\'' && s[i + 1] == '\'') {
            adv = 2;
        }
        for (size_t k = 0; k < adv && s[i] != '\0'; k++, i++)
            c++;
        v += made;
    }
    *line = l;
    *column = c;
}

void sk_conf_where_begin(const struct sk_conf *conf)
{
    where_conf = conf;
}

int sk_conf_queue_setting(const char *config, const char *key, char *buf, size_t size)
{
    for (size_t i = 0; where_conf != NULL && config != NULL && key != NULL &&
                       i < where_conf->n_queues; i++) {
        const struct sk_queue_conf *q = &where_conf->queues[i];
        if (q->handler_config != config)
            continue;
        if (strcmp(key, "name") == 0)
            return snprintf(buf, size, "%s", q->name);
        if (strcmp(key, "mode") == 0)
            return snprintf(buf, size, "%s",
                            q->mode == SK_MODE_EXTERNAL ? "external" : "transactional");
        if (strcmp(key, "lease") == 0)
            return snprintf(buf, size, "%u", (unsigned)q->lease_ms);
        if (strcmp(key, "job_timeout") == 0)
            return snprintf(buf, size, "%u", (unsigned)q->job_timeout_ms);
        if (strcmp(key, "batch") == 0)
            return snprintf(buf, size, "%d", q->batch);
        return -1;
    }
    return -1;
}

int sk_conf_where(const char *config, const char *key, size_t offset, char *buf, size_t size)
{
    if (where_conf == NULL || config == NULL || key == NULL)
        return -1;
    for (size_t i = 0; i < where_conf->n_queues; i++) {
        const struct sk_queue_conf *q = &where_conf->queues[i];
        if (q->handler_config != config)
            continue;
        for (size_t j = 0; j < q->n_config_marks; j++) {
            const struct sk_conf_mark *m = &q->config_marks[j];
            if (strcmp(m->key, key) != 0)
                continue;
            uint32_t line, column;
            walk_mark(m, offset, &line, &column);
            return snprintf(buf, size, "%s:%u:%u", where_conf->path, line, column);
        }
        return -1;
    }
    return -1;
}
