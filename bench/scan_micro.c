/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * scan-micro: CPU cost of the SSE usage scanner per byte, the reference
 * (byte-at-a-time) scanner of tests/ref against src/usage_scan.c, in one run.
 *
 *   bench/scan-micro [MILLISECONDS]     (per cell, default 150)
 *
 * The stream is what vLLM sends for a chat completion asked for usage: 32
 * content chunks of about 256 bytes, the usage chunk, [DONE]. The "null"
 * variant ends every content chunk in ,"usage":null as vLLM and OpenAI do
 * once include_usage is on. It is fed as the relay feeds it (each read
 * until consumed) in reads of 16 KiB, of one event each (read "event": a
 * runner that flushes every chunk, as the relay sees bench/throughput's
 * stub) and of 100 bytes, with the usage event dropped (sluice injected
 * the option) and kept (the client asked).
 * Each cell is the best of several timed repetitions of about 2 ms of
 * thread CPU time (the machine is shared), the two scanners alternating;
 * memcpy of the same bytes is printed for scale. Before timing,
 * the scanners must report the same usage and content bytes. "kept" is the
 * new scanner told to keep its event template across reads
 * (sl_usage_scan_keep), as the relay does for a stream whose events come
 * close together.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sl_usage.h"
#include "usage_ref.h"

#define NEVENTS 32

static const char *const words[] = {
	" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy",
	" dog", ",", " and", " then", " it", " said", ": \\\"hello\\\"", "\\n",
	" tokens", " stream", " one", " by", " one", ".", " Inference", " is",
};

/* The SSE body; *len its length. with_null: ,"usage":null in each chunk. */
static char *
make_stream(int with_null, size_t *len)
{
	size_t cap = 64 * 1024, n = 0, k;
	char *b = malloc(cap), content[256];
	unsigned seed = 7;
	int i;

	if (b == NULL)
		abort();
	for (i = 0; i < NEVENTS; i++) {
		size_t cl = 0;

		/* about 40 bytes of content: one to several tokens */
		while (cl < 40) {
			const char *w;

			seed = seed * 1103515245u + 12345u;
			w = words[(seed >> 16) % (sizeof(words) / sizeof(words[0]))];
			memcpy(content + cl, w, strlen(w));
			cl += strlen(w);
		}
		content[cl] = '\0';
		n += (size_t)snprintf(b + n, cap - n,
		    "data: {\"id\":\"chatcmpl-9f3b2c1a7e6d4f0b8a2c3d4e5f6a7b8c\","
		    "\"object\":\"chat.completion.chunk\",\"created\":1733097600,"
		    "\"model\":\"meta-llama/Meta-Llama-3.1-8B-Instruct\","
		    "\"choices\":[{\"index\":0,\"delta\":{%s\"content\":\"%s\"},"
		    "\"logprobs\":null,\"finish_reason\":%s}]%s}\n\n",
		    i == 0 ? "\"role\":\"assistant\"," : "", i == 0 ? "" : content,
		    i == NEVENTS - 1 ? "\"stop\"" : "null",
		    with_null ? ",\"usage\":null" : "");
	}
	n += (size_t)snprintf(b + n, cap - n,
	    "data: {\"id\":\"chatcmpl-9f3b2c1a7e6d4f0b8a2c3d4e5f6a7b8c\","
	    "\"object\":\"chat.completion.chunk\",\"created\":1733097600,"
	    "\"model\":\"meta-llama/Meta-Llama-3.1-8B-Instruct\",\"choices\":[],"
	    "\"usage\":{\"prompt_tokens\":27,\"total_tokens\":411,\"completion_tokens\":384}}"
	    "\n\ndata: [DONE]\n\n");
	for (k = 0; k < n; k++)
		if (b[k] == '\0')
			abort();
	*len = n;
	return b;
}

/* Read sizes "one event", by the offset where each read starts (mark_events). */
static uint16_t evread[64 * 1024];

static void
mark_events(const char *in, size_t len)
{
	size_t off = 0;
	const char *ev;

	while (off < len) {
		ev = memmem(in + off, len - off, "\n\n", 2);
		evread[off] = (uint16_t)(ev != NULL ? (size_t)(ev + 2 - (in + off)) : len - off);
		off += evread[off];
	}
}

/* Bytes of the next read at off: rd, or (rd 0) through the next blank line. */
static size_t
read_len(const char *in, size_t len, size_t off, size_t rd)
{
	(void)in;
	if (rd != 0)
		return len - off < rd ? len - off : rd;
	return evread[off];
}

static double
now_ns(void)
{
	struct timespec ts;

	/* CPU time of this thread: time spent preempted on a shared machine is not counted */
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/*
 * Output bytes of one stream through the new scanner (sink keeps it honest);
 * keep: with its event template kept across reads (sl_usage_scan_keep).
 */
static size_t
scan_new(const char *in, size_t len, size_t rd, int drop, int keep, struct sl_usage *u,
    uint64_t *cb)
{
	struct sl_usage_scan s;
	struct sl_usage_out o;
	size_t off = 0, want, used, k, outn = 0;

	sl_usage_scan_init(&s, drop);
	sl_usage_scan_keep(&s, keep);
	while (off < len) {
		want = read_len(in, len, off, rd);
		while (want > 0) {
			used = sl_usage_scan_feed(&s, in + off, want, &o);
			outn += o.held_len;
			for (k = 0; k < o.n; k++)
				outn += o.range[k].len;
			off += used;
			want -= used;
		}
	}
	sl_usage_scan_finish(&s, &o);
	outn += o.held_len;
	sl_usage_scan_result(&s, u, cb);
	sl_usage_scan_free(&s);
	return outn;
}

static size_t
run_new(const char *in, size_t len, size_t rd, int drop, struct sl_usage *u, uint64_t *cb)
{
	return scan_new(in, len, rd, drop, 0, u, cb);
}

static size_t
run_kept(const char *in, size_t len, size_t rd, int drop, struct sl_usage *u, uint64_t *cb)
{
	return scan_new(in, len, rd, drop, 1, u, cb);
}

static size_t
run_ref(const char *in, size_t len, size_t rd, int drop, struct sl_usage *u, uint64_t *cb)
{
	struct ref_scan s;
	struct ref_out o;
	size_t off = 0, want, used, k, outn = 0;

	ref_scan_init(&s, drop);
	while (off < len) {
		want = read_len(in, len, off, rd);
		while (want > 0) {
			used = ref_scan_feed(&s, in + off, want, &o);
			outn += o.held_len;
			for (k = 0; k < o.n; k++)
				outn += o.range[k].len;
			off += used;
			want -= used;
		}
	}
	ref_scan_finish(&s, &o);
	outn += o.held_len;
	ref_scan_result(&s, u, cb);
	ref_scan_free(&s);
	return outn;
}

static size_t
run_memcpy(const char *in, size_t len, size_t rd, int drop, struct sl_usage *u, uint64_t *cb)
{
	static char dst[16384];
	size_t off, n, sum = 0;

	(void)drop;
	for (off = 0; off < len; off += n) {
		n = read_len(in, len, off, rd);
		memcpy(dst, in + off, n);
		sum += (unsigned char)dst[n - 1];
	}
	memset(u, 0, sizeof(*u));
	*cb = sum;
	return len;
}

typedef size_t (*runner)(const char *, size_t, size_t, int, struct sl_usage *, uint64_t *);

static volatile size_t sink;

/* Streams per repetition of r: about 2 ms of work. */
static int
reps_for(runner r, const char *in, size_t len, size_t rd, int drop)
{
	struct sl_usage u;
	uint64_t cb;
	double t0 = now_ns(), t;

	sink += r(in, len, rd, drop, &u, &cb);
	t = now_ns() - t0;
	return (int)(2e6 / (t > 1 ? t : 1)) + 1;
}

/* ns per byte of one repetition. */
static double
time_rep(runner r, int reps, const char *in, size_t len, size_t rd, int drop)
{
	struct sl_usage u;
	uint64_t cb;
	double t0 = now_ns();
	int i;

	for (i = 0; i < reps; i++)
		sink += r(in, len, rd, drop, &u, &cb);
	return (now_ns() - t0) / reps / (double)len;
}

/* Best ns per byte of each runner, repetitions alternating, about ms in all. */
static void
time_cell(runner *rs, double *best, int nr, const char *in, size_t len, size_t rd,
    int drop, double ms)
{
	double start = now_ns(), t;
	int reps[4], k;

	for (k = 0; k < nr; k++) {
		reps[k] = reps_for(rs[k], in, len, rd, drop);
		best[k] = 1e30;
	}
	do {
		for (k = 0; k < nr; k++) {
			t = time_rep(rs[k], reps[k], in, len, rd, drop);
			if (t < best[k])
				best[k] = t;
		}
	} while (now_ns() - start < ms * 1e6);
}

int
main(int argc, char **argv)
{
	static const size_t reads[] = { 16384, 0, 100 };   /* 0: one event */
	double ms = argc > 1 ? atof(argv[1]) : 150;
	int v, d, k;

	printf("%-6s %-5s %6s %7s | %9s %9s %9s %9s | %7s %8s\n", "stream", "drop", "read",
	    "bytes", "ref ns/B", "new ns/B", "kept ns/B", "memcpy", "ref/new", "new/kept");
	for (v = 0; v < 2; v++) {
		size_t len;
		char *in = make_stream(v, &len);

		mark_events(in, len);

		for (d = 1; d >= 0; d--) {
			for (k = 0; k < 3; k++) {
				struct sl_usage ua, ub, uc;
				uint64_t ca, cb, cc;
				runner rs[4] = { run_ref, run_new, run_kept, run_memcpy };
				double best[4];
				char rdn[16];

				run_ref(in, len, reads[k], d, &ua, &ca);
				run_new(in, len, reads[k], d, &ub, &cb);
				run_kept(in, len, reads[k], d, &uc, &cc);
				if (ua.have != 1 || ub.have != 1 || uc.have != 1 ||
				    ua.prompt_tokens != ub.prompt_tokens ||
				    ua.completion_tokens != ub.completion_tokens || ca != cb ||
				    ua.prompt_tokens != uc.prompt_tokens ||
				    ua.completion_tokens != uc.completion_tokens || ca != cc) {
					fprintf(stderr, "scan-micro: the scanners disagree\n");
					return 1;
				}
				time_cell(rs, best, 4, in, len, reads[k], d, ms);
				snprintf(rdn, sizeof(rdn), "%zu", reads[k]);
				printf("%-6s %-5s %6s %7zu | %9.3f %9.3f %9.3f %9.3f | %6.1fx %7.1fx\n",
				    v ? "null" : "plain", d ? "on" : "off", reads[k] ? rdn : "event", len,
				    best[0], best[1], best[2], best[3], best[0] / best[1],
				    best[1] / best[2]);
				fflush(stdout);
			}
		}
		free(in);
	}
	return 0;
}
