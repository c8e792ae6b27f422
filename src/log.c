/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Error log on stderr. Each line is formatted whole and written with one
 * write(2), so lines from the master and workers never interleave.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "sl_log.h"

static enum sl_log_level log_level = SL_LOG_INFO;
static const char *log_role = "master";

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void
sl_log_init(enum sl_log_level level, const char *role)
{
	log_level = level;
	log_role = role;
}

void
sl_log_set_level(enum sl_log_level level)
{
	log_level = level;
}

int
sl_log_enabled(enum sl_log_level level)
{
	return level <= log_level;
}

void
sl_log(enum sl_log_level level, const char *fmt, ...)
{
	char line[1024];
	struct timeval tv;
	struct tm tm;
	size_t n;
	int k;
	va_list ap;

	if (level > log_level)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	k = snprintf(line + n, sizeof(line) - n, ".%03dZ sluice[%d] %s: %s: ",
	    (int)(tv.tv_usec / 1000), (int)getpid(), log_role,
	    level_names[level]);
	if (k > 0)
		n += (size_t)k;
	if (n < sizeof(line)) {
		va_start(ap, fmt);
		k = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
		va_end(ap);
		if (k > 0)
			n += (size_t)k;
	}
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	/* One write: lines from different processes stay whole. */
	(void)!write(STDERR_FILENO, line, n);
}
