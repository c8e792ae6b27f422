/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_log: the error log (stderr). One line per message:
 *   2026-11-30T05:00:00.123Z sluice[1234]: warn: message
 */
#ifndef SL_LOG_H
#define SL_LOG_H

#include "sl_config.h"

/* Set the least severe level that is written and the role shown in lines. */
void sl_log_init(enum sl_log_level level, const char *role);
void sl_log_set_level(enum sl_log_level level);
int sl_log_enabled(enum sl_log_level level);

void sl_log(enum sl_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define sl_err(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)
#define sl_warn(...) sl_log(SL_LOG_WARN, __VA_ARGS__)
#define sl_info(...) sl_log(SL_LOG_INFO, __VA_ARGS__)
#define sl_debug(...) do { if (sl_log_enabled(SL_LOG_DEBUG)) \
	sl_log(SL_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
