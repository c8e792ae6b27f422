/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * mrw-micro: CPU cost per byte of setting an answer's "model" back
 * (sl_mrw_feed, src/model.c), the step every relayed byte of a request
 * routed to a model under another name goes through.
 *
 *   bench/mrw-micro [MILLISECONDS]     (per cell, default 150)
 *
 * Two answers: an event stream as vLLM sends it (32 chunks of about 256
 * bytes, each naming its model; the name is replaced in each) and one
 * JSON body of the same content (one replacement). Fed in reads of 16 KiB,
 * of one event each, and of 100 bytes. Each cell is the best of several
 * timed repetitions of about 2 ms of thread CPU time (the machine is
 * shared); memcpy of the same bytes is printed for scale. Before timing,
 * the output must name the new model as many times as the input named
 * the old one.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sl_model.h"

#define NEVENTS 32

static char *
make_body(int sse, size_t *len, size_t *nev)
{
	size_t cap = 64 * 1024, n = 0;
	char *b = malloc(cap);
	int i;

	if (b == NULL)
		abort();
	if (!sse)
		n += (size_t)snprintf(b + n, cap - n, "{\"id\":\"cmpl-1\","
		    "\"object\":\"chat.completion\",\"created\":1700000000,"
		    "\"model\":\"served-name\",\"choices\":[");
	for (i = 0; i < NEVENTS; i++) {
		if (sse)
			n += (size_t)snprintf(b + n, cap - n, "data: {\"id\":"
			    "\"chatcmpl-4b1e6f\",\"object\":\"chat.completion."
			    "chunk\",\"created\":1700000000,\"model\":\"served-"
			    "name\",\"choices\":[{\"index\":0,\"delta\":{"
			    "\"content\":\" the quick brown fox jumps over a "
			    "lazy dog, token %d\"},\"logprobs\":null,"
			    "\"finish_reason\":null}]}\n\n", i);
		else
			n += (size_t)snprintf(b + n, cap - n, "%s{\"index\":%d,"
			    "\"message\":{\"role\":\"assistant\",\"content\":"
			    "\"the quick brown fox jumps over a lazy dog, \\\""
			    "token\\\" %d of the answer in one body\"},"
			    "\"logprobs\":null,\"finish_reason\":null}",
			    i ? "," : "", i, i);
	}
	if (sse)
		n += (size_t)snprintf(b + n, cap - n, "data: [DONE]\n\n");
	else
		n += (size_t)snprintf(b + n, cap - n, "]}\n");
	*len = n;
	*nev = sse ? NEVENTS : 1;
	return b;
}

static double
cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static size_t
count(const char *p, size_t n, const char *w)
{
	size_t c = 0, wl = strlen(w), i;

	for (i = 0; i + wl <= n; i++)
		if (memcmp(p + i, w, wl) == 0)
			c++;
	return c;
}

/* One pass of body in reads of `read` bytes (0: one event each); out gets
 * what the client is given. */
static size_t
feed(const char *body, size_t len, int sse, size_t read, char *out)
{
	static const char lit[] = "\"client-name\"";
	struct sl_mrw m;
	struct sl_mrw_buf mb = { NULL, 0, 0 };
	size_t off = 0, o = 0, k;

	sl_mrw_init(&m, sse, lit, sizeof(lit) - 1);
	while (off < len) {
		if (read == 0) {
			const char *e = strstr(body + off, "\n\n");

			k = e != NULL ? (size_t)(e + 2 - (body + off)) : len - off;
		} else
			k = len - off < read ? len - off : read;
		switch (sl_mrw_feed(&m, body + off, k, &mb)) {
		case 0:
			memcpy(out + o, body + off, k);
			o += k;
			break;
		case 1:
			memcpy(out + o, mb.p, mb.len);
			o += mb.len;
			break;
		default:
			abort();
		}
		off += k;
	}
	free(mb.p);
	return o;
}

int
main(int argc, char **argv)
{
	static const size_t reads[] = { 16384, 0, 100 };
	double ms = argc > 1 ? atof(argv[1]) : 150;
	int sse;
	size_t r;

	printf("body   read   bytes |  mrw ns/B  memcpy ns/B | mrw/memcpy\n");
	for (sse = 1; sse >= 0; sse--) {
		size_t len, nev;
		char *body = make_body(sse, &len, &nev), *out = malloc(2 * len);

		for (r = 0; r < 3; r++) {
			double best = 1e30, bestc = 1e30, spent = 0;
			size_t o;

			if (!sse && reads[r] == 0)
				continue;   /* one body: no events */
			o = feed(body, len, sse, reads[r], out);
			if (count(out, o, "\"client-name\"") != nev ||
			    count(out, o, "served-name") != 0) {
				fprintf(stderr, "mrw-micro: wrong output\n");
				return 1;
			}
			while (spent < ms * 1e6) {
				double t0 = cpu_ns(), t1;
				int k, reps = 0;

				do {
					for (k = 0; k < 16; k++)
						feed(body, len, sse, reads[r], out);
					reps += 16;
					t1 = cpu_ns();
				} while (t1 - t0 < 2e6);
				if ((t1 - t0) / reps / len < best)
					best = (t1 - t0) / reps / len;
				spent += t1 - t0;
				t0 = cpu_ns();
				for (k = 0; k < reps; k++) {
					memcpy(out, body, len);
					__asm__ volatile("" : : "r"(out) : "memory");
				}
				t1 = cpu_ns();
				if ((t1 - t0) / reps / len < bestc)
					bestc = (t1 - t0) / reps / len;
				spent += t1 - t0;
			}
			printf("%-5s %5s %7zu | %9.3f %12.3f | %9.1fx\n",
			    sse ? "sse" : "json", reads[r] == 0 ? "event" :
			    reads[r] == 100 ? "100" : "16384", len, best, bestc,
			    best / bestc);
		}
		free(out);
		free(body);
	}
	return 0;
}
