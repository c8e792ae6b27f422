/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sluice: a streaming gateway for LLM inference.
 *
 *   sluice [-c FILE] [-t] [-V] [-h]
 */
#include "config.h"

#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "sl_config.h"
#include "sl_master.h"

#ifndef SYSCONFDIR
#define SYSCONFDIR "/usr/local/etc"
#endif
#define DEFAULT_CONFIG SYSCONFDIR "/sluice/sluice.yaml"

static void
usage(FILE *fp)
{
	fprintf(fp,
	    "usage: sluice [-c FILE] [-t] [-V] [-h]\n"
	    "  -c FILE  configuration file (default " DEFAULT_CONFIG ")\n"
	    "  -t       check the configuration and exit\n"
	    "  -V       print the version and exit\n"
	    "  -h       print this help and exit\n"
	    "Signals to the master: HUP reload, TERM/INT drain and exit, "
	    "QUIT exit now.\n"
	    "See sluice(8) and sluice.yaml(5).\n");
}

int
main(int argc, char **argv)
{
	const char *path = DEFAULT_CONFIG;
	struct sl_config *cfg = NULL;
	struct sl_errors errs = { NULL, 0 };
	int ch, test = 0;

#ifdef __GLIBC__
	/*
	 * Large blocks from mmap, always: glibc raises this threshold when a
	 * large block is freed (reading a big configuration frees many), and
	 * then the tables sized by limits.max_tenants would come from the
	 * heap, zeroed page by page, instead of as pages that cost nothing
	 * until an index uses them.
	 */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif

	while ((ch = getopt(argc, argv, "c:tVh")) != -1) {
		switch (ch) {
		case 'c':
			path = optarg;
			break;
		case 't':
			test = 1;
			break;
		case 'V':
			printf("sluice %s (%s)\n", PACKAGE_VERSION, curl_version());
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "sluice: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (sl_config_load_file_apart(path, &cfg, &errs) == -1) {
		sl_errors_print(&errs, stderr);
		if (!test)
			fprintf(stderr, "sluice: %zu problem(s) in %s; not started\n",
			    errs.n, path);
		sl_errors_free(&errs);
		return 1;
	}
	if (test) {
		char warn[PATH_MAX + 128];

		/* As the master warns at start and reload; not an error. */
		if (sl_config_permission_warning(path, warn, sizeof(warn)))
			fprintf(stderr, "sluice: warning: %s\n", warn);
		if (cfg->tls.warning != NULL)
			fprintf(stderr, "sluice: warning: %s\n", cfg->tls.warning);
		printf("%s: ok\n", path);
		sl_config_free(cfg);
		return 0;
	}
	return sl_master_run(path, cfg);
}
