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
 *
 * Then the same answer (its chunks of content, its usage) as a chat, an
 * OpenAI Responses API and an Anthropic Messages API stream, each through
 * its own scanner (sl_usage_scan_init_api), the three timed in turns:
 * ns/B, ns per stream (per request), and per stream against chat.
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

/* The content of chunk i (0: none, as the chat stream's first), as make_stream makes it. */
static void
chunk_text(int i, unsigned *seed, char content[256])
{
	size_t cl = 0;

	while (cl < 40) {
		const char *w;

		*seed = *seed * 1103515245u + 12345u;
		w = words[(*seed >> 16) % (sizeof(words) / sizeof(words[0]))];
		memcpy(content + cl, w, strlen(w));
		cl += strlen(w);
	}
	content[cl] = '\0';
	if (i == 0)
		content[0] = '\0';
}

#define RESP_OBJ "\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\"," \
	"\"object\":\"response\",\"created_at\":1741290958,\"error\":null," \
	"\"incomplete_details\":null,\"instructions\":null,\"max_output_tokens\":null," \
	"\"model\":\"meta-llama/Meta-Llama-3.1-8B-Instruct\",\"parallel_tool_calls\":true," \
	"\"previous_response_id\":null,\"reasoning\":{\"effort\":null,\"summary\":null}," \
	"\"store\":false,\"temperature\":1.0,\"text\":{\"format\":{\"type\":\"text\"}}," \
	"\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,\"truncation\":\"disabled\"," \
	"\"user\":null,\"metadata\":{}"
#define RESP_ITEM "\"item_id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\"," \
	"\"output_index\":0,\"content_index\":0"

/*
 * The same answer (the chat stream's chunks of content, the same usage)
 * as a Responses API stream (api SL_API_RESPONSES: what OpenAI sends,
 * created to completed, the full text again in the done events and the
 * completed one) or a Messages API stream (SL_API_MESSAGES: Anthropic's).
 */
static char *
make_api_stream(enum sl_api api, size_t *len)
{
	size_t cap = 64 * 1024, n = 0, k, tl = 0;
	char *b = malloc(cap), content[256], text[64 * 256];
	unsigned seed = 7;
	int i;

	if (b == NULL)
		abort();
	if (api == SL_API_RESPONSES) {
		for (i = 0; i < 2; i++)
			n += (size_t)snprintf(b + n, cap - n,
			    "event: response.%s\ndata: {\"type\":\"response.%s\","
			    "\"sequence_number\":%d,\"response\":{" RESP_OBJ ",\"status\":"
			    "\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
			    i ? "in_progress" : "created", i ? "in_progress" : "created", i);
		n += (size_t)snprintf(b + n, cap - n,
		    "event: response.output_item.added\ndata: {\"type\":"
		    "\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,"
		    "\"item\":{\"id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\","
		    "\"type\":\"message\",\"status\":\"in_progress\",\"content\":[],"
		    "\"role\":\"assistant\"}}\n\n"
		    "event: response.content_part.added\ndata: {\"type\":"
		    "\"response.content_part.added\",\"sequence_number\":3," RESP_ITEM
		    ",\"part\":{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],"
		    "\"text\":\"\"}}\n\n");
	} else {
		n += (size_t)snprintf(b + n, cap - n,
		    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"
		    "{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\","
		    "\"role\":\"assistant\",\"model\":\"meta-llama/Meta-Llama-3.1-8B-Instruct\","
		    "\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":"
		    "{\"input_tokens\":27,\"cache_creation_input_tokens\":0,"
		    "\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n"
		    "event: content_block_start\ndata: {\"type\":\"content_block_start\","
		    "\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
		    "event: ping\ndata: {\"type\": \"ping\"}\n\n");
	}
	for (i = 0; i < NEVENTS; i++) {
		chunk_text(i, &seed, content);
		if (i == 0)
			continue;
		memcpy(text + tl, content, strlen(content));
		tl += strlen(content);
		if (api == SL_API_RESPONSES)
			n += (size_t)snprintf(b + n, cap - n,
			    "event: response.output_text.delta\ndata: {\"type\":"
			    "\"response.output_text.delta\",\"sequence_number\":%d," RESP_ITEM
			    ",\"delta\":\"%s\",\"logprobs\":[]}\n\n", i + 3, content);
		else
			n += (size_t)snprintf(b + n, cap - n,
			    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
			    "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"%s\"}}\n\n",
			    content);
	}
	text[tl] = '\0';
	if (api == SL_API_RESPONSES)
		n += (size_t)snprintf(b + n, cap - n,
		    "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\","
		    "\"sequence_number\":35," RESP_ITEM ",\"text\":\"%s\",\"logprobs\":[]}\n\n"
		    "event: response.content_part.done\ndata: {\"type\":"
		    "\"response.content_part.done\",\"sequence_number\":36," RESP_ITEM
		    ",\"part\":{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],"
		    "\"text\":\"%s\"}}\n\n"
		    "event: response.completed\ndata: {\"type\":\"response.completed\","
		    "\"sequence_number\":37,\"response\":{" RESP_OBJ ",\"status\":\"completed\","
		    "\"output\":[{\"id\":\"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654\","
		    "\"type\":\"message\",\"status\":\"completed\",\"content\":[{\"type\":"
		    "\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":\"%s\"}],"
		    "\"role\":\"assistant\"}],\"usage\":{\"input_tokens\":27,"
		    "\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":384,"
		    "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":411}}}\n\n",
		    text, text, text);
	else
		n += (size_t)snprintf(b + n, cap - n,
		    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
		    "\"index\":0}\n\n"
		    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
		    "{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":"
		    "{\"output_tokens\":384}}\n\n"
		    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
	if (n >= cap)
		abort();
	for (k = 0; k < n; k++)
		if (b[k] == '\0')
			abort();
	*len = n;
	return b;
}

/*
 * Read sizes "one event", by the offset where each read starts
 * (mark_events), for each stream in use (read_len finds its stream's).
 */
#define NSTREAMS 8
static struct {
	const char *in;
	uint16_t ev[64 * 1024];
} evtab[NSTREAMS];
static uint16_t *evread = evtab[0].ev;

static void
mark_events(const char *in, size_t len)
{
	size_t off = 0;
	const char *ev;
	int k;

	for (k = 0; k < NSTREAMS - 1 && evtab[k].in != NULL && evtab[k].in != in; k++)
		;
	evtab[k].in = in;
	evread = evtab[k].ev;
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
	if (rd != 0)
		return len - off < rd ? len - off : rd;
	if (in != evtab[0].in) {
		int k;

		for (k = 1; k < NSTREAMS - 1 && evtab[k].in != in; k++)
			;
		return evtab[k].ev[off];
	}
	return evtab[0].ev[off];
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

/* One stream through the scanner of api (the drop argument): never dropping. */
static size_t
run_api(const char *in, size_t len, size_t rd, int api, struct sl_usage *u, uint64_t *cb)
{
	struct sl_usage_scan s;
	struct sl_usage_out o;
	size_t off = 0, want, used, k, outn = 0;

	sl_usage_scan_init_api(&s, (enum sl_api)api);
	while (off < len) {
		want = read_len(in, len, off, rd);
		while (want > 0) {
			used = sl_usage_scan_feed(&s, in + off, want, &o);
			for (k = 0; k < o.n; k++)
				outn += o.range[k].len;
			off += used;
			want -= used;
		}
	}
	sl_usage_scan_finish(&s, &o);
	sl_usage_scan_result(&s, u, cb);
	sl_usage_scan_free(&s);
	return outn;
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

/*
 * The same answer as a chat, a Responses and a Messages stream, each
 * through its scanner (nothing dropped: the option was not injected, or
 * there is none), the three alternating in each cell: ns/B, and ns per
 * stream, that is per request, against chat's.
 */
static int
api_table(double ms)
{
	static const size_t reads[] = { 16384, 0, 100 };
	static const enum sl_api api[3] = { SL_API_CHAT, SL_API_RESPONSES, SL_API_MESSAGES };
	static const char *const names[3] = { "chat", "responses", "messages" };
	char *in[3];
	size_t len[3], rd;
	uint64_t cb0 = 0;
	double best[3], t, start;
	int reps[3], a, k;

	in[0] = make_stream(0, &len[0]);
	in[1] = make_api_stream(SL_API_RESPONSES, &len[1]);
	in[2] = make_api_stream(SL_API_MESSAGES, &len[2]);
	for (a = 0; a < 3; a++) {
		struct sl_usage u;
		uint64_t cb;

		mark_events(in[a], len[a]);
		run_api(in[a], len[a], 0, (int)api[a], &u, &cb);
		if (a == 0)
			cb0 = cb;
		if (u.have != 1 || u.prompt_tokens != 27 || u.completion_tokens != 384 ||
		    cb != cb0) {
			fprintf(stderr, "scan-micro: %s: not the chat stream's usage and content\n",
			    names[a]);
			return 1;
		}
	}
	printf("\n%-10s %6s %7s | %9s %11s | %9s | %8s\n", "api", "read", "bytes", "ns/B",
	    "ns/stream", "memcpy", "vs chat");
	for (k = 0; k < 3; k++) {
		rd = reads[k];
		for (a = 0; a < 3; a++) {
			struct sl_usage u;
			uint64_t cb;
			double t0 = now_ns();

			sink += run_api(in[a], len[a], rd, (int)api[a], &u, &cb);
			t = now_ns() - t0;
			reps[a] = (int)(2e6 / (t > 1 ? t : 1)) + 1;
			best[a] = 1e30;
		}
		start = now_ns();
		do {
			for (a = 0; a < 3; a++) {
				struct sl_usage u;
				uint64_t cb;
				double t0 = now_ns();
				int i;

				for (i = 0; i < reps[a]; i++)
					sink += run_api(in[a], len[a], rd, (int)api[a], &u, &cb);
				t = (now_ns() - t0) / reps[a];
				if (t < best[a])
					best[a] = t;
			}
		} while (now_ns() - start < 3 * ms * 1e6);
		for (a = 0; a < 3; a++) {
			double mc[1];
			runner r[1] = { run_memcpy };
			char rdn[16];

			time_cell(r, mc, 1, in[a], len[a], rd, 0, ms / 3);
			snprintf(rdn, sizeof(rdn), "%zu", rd);
			printf("%-10s %6s %7zu | %9.3f %11.0f | %9.3f | %7.2fx\n", names[a],
			    rd ? rdn : "event", len[a], best[a] / (double)len[a], best[a], mc[0],
			    best[a] / best[0]);
		}
		fflush(stdout);
	}
	for (a = 0; a < 3; a++)
		free(in[a]);
	return 0;
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
	return api_table(ms);
}
