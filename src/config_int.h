/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Inside the configuration parser: what its files share, and nothing the
 * rest of sluice may use (that is sl_config.h).
 *
 * The files, from the bottom up; each calls only those listed before it:
 *
 *   config_values.c     a scalar's text -> a number or a verdict; sees no
 *                       YAML and reports nothing.
 *   config.c            the key table, the error reporter, the typed
 *                       setter driven by the table, YAML walking, the top
 *                       level and the load (which calls the sections).
 *   config_upstreams.c  upstreams: and their replicas.
 *   config_models.c     models: their names, aliases, targets, fallbacks.
 *   config_tenants.c    tenants: their keys, limits and allowed models.
 *
 * A section file calls the value parsers and config.c's services (the
 * reporter, the key table, the setter, the walking helpers); config.c
 * calls a section only through its cfg_parse_* entry point. The section
 * files do not call each other, save through sl_config.h's lookups.
 */
#ifndef SL_CONFIG_INT_H
#define SL_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

#include "sl_config.h"

#define KIB 1024ULL
#define MIB (1024ULL * KIB)
#define GIB (1024ULL * MIB)
#define SEC 1000ULL
#define MIN (60ULL * SEC)
#define HOUR (60ULL * MIN)

/* ---- value parsers (config_values.c) ------------------------------------
 * Pure functions of their arguments. The parsers return 0 and set *out, or
 * -1 leaving *out alone; the cfg_valid_* checks return 1 if s is well
 * formed, else 0.
 */

/* Decimal, optional sign, nothing around it; the whole int64_t range. */
int cfg_parse_int(const char *s, int64_t *out);
/* "1.5" -> 150: at most 2 decimals, no sign, at most 10^9 hundredths. */
int cfg_parse_hundredths(const char *s, int64_t *out);
/* host:port or [v6]:port, port 1-65535; digits-and-dots hosts are IPv4. */
int cfg_valid_addr(const char *s);
/* A URL authority's optional :PORT (n bytes of it): 0 if valid, else -1. */
int cfg_check_url_port(const char *a, size_t n);
/* A Redis address with no host name to resolve: IP:port or unix:/path. */
int cfg_valid_redis_addr(const char *s);
/* 1 if s holds a control character (below 0x20, or DEL). */
int cfg_has_control(const char *s);
/* A cluster node name: 1-64 of A-Z a-z 0-9 . _ - */
int cfg_valid_node_name(const char *s);
/* A client API key: non-empty, no space, control character or DEL. */
int cfg_valid_api_key(const char *s);
/* A probe path for a request line: '/' first, no space or control. */
int cfg_valid_probe_path(const char *s);

#endif
