/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration, its errors: each problem one "FILE:LINE:COL: message"
 * kept in a struct sl_errors, all of them, in the order they are found
 * (the load sorts them by position). Calls nothing of the parser.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <yaml.h>

#include "sl_config.h"
#include "config_int.h"

/* ---- errors ---------------------------------------------------------- */

void
sl_errors_free(struct sl_errors *e)
{
	size_t i;

	for (i = 0; i < e->n; i++)
		free(e->msg[i]);
	free(e->msg);
	e->msg = NULL;
	e->n = 0;
}

void
sl_errors_print(const struct sl_errors *e, FILE *fp)
{
	size_t i;

	for (i = 0; i < e->n; i++)
		fprintf(fp, "%s\n", e->msg[i]);
}

void
cfg_err_add(struct sl_errors *e, char *msg)
{
	char **nm;

	if (msg == NULL)
		return;
	/* Capacity is the next power of two: a file with n errors costs O(n). */
	if ((e->n & (e->n - 1)) == 0) {
		nm = realloc(e->msg, (e->n ? 2 * e->n : 1) * sizeof(*nm));
		if (nm == NULL) {
			free(msg);
			return;
		}
		e->msg = nm;
	}
	e->msg[e->n++] = msg;
}

void
cfg_err_at(struct ctx *c, const yaml_mark_t *m, const char *fmt, ...)
{
	char body[512], *msg;
	va_list ap;

	/*
	 * An aliased value was reported once, where the alias is; what its
	 * copy would say again at the anchor's position is noise.
	 */
	if (c->quiet)
		return;

	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	/* One problem, one line: a value quoted in it may hold controls. */
	for (msg = body; *msg != '\0'; msg++)
		if ((unsigned char)*msg < 0x20 || *msg == 0x7f)
			*msg = '?';
	if (asprintf(&msg, "%s:%zu:%zu: %s", c->name,
	    m ? m->line + 1 : 1, m ? m->column + 1 : 1, body) < 0)
		return;
	cfg_err_add(c->errs, msg);
}
