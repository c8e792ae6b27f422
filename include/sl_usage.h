/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_usage: token usage from OpenAI-compatible requests and responses.
 *
 * Three pure pieces, no I/O, no logging, no globals; the relay calls them
 * from above and owns every buffer it passes in:
 *
 *  1. sl_usage_request(): reads a request body (validated in one pass that
 *     builds nothing, sl_json.h), estimates its prompt and, for a streamed
 *     request whose client did not ask for usage, builds the body to send
 *     upstream: the original bytes with exactly one member inserted (or one
 *     false value replaced), so the runner sends its usage chunk. Anything
 *     else is forwarded untouched.
 *  2. sl_usage_from_json(): the `usage` object of a non-streamed response.
 *  3. struct sl_usage_scan: a streaming scanner over an SSE response body. It builds no JSON tree for ordinary events and allocates nothing
 *     for them; only the `usage` object of the usage event is copied and
 *     parsed with jansson. It counts the bytes of `"content"`, `"text"`,
 *     `"arguments"` (tool calls), `"reasoning_content"` and `"reasoning"`
 *     string values (for the bytes/4 estimate when no usage arrives), and,
 *     when sluice injected the option, cuts the usage event out of what the
 *     client receives, and the `"usage":null` member runners add to every
 *     other chunk once asked (vLLM, OpenAI), forwarding every other byte
 *     unchanged.
 *
 * The other metered APIs (sl_api.h) have their own entry points beside
 * these: sl_usage_request_api() (Responses, Messages, embeddings request
 * bodies: never edited), sl_usage_from_json_api() and
 * sl_usage_json_content_api() (their non-streamed answers), and
 * sl_usage_scan_init_api(), which gives a Responses or Messages event
 * stream a lexer of its own (usage_api.c) behind the same feed, finish and
 * result calls; nothing is held or removed from those streams.
 *
 * JSON dialect. Request bodies are read as a Python runner's json.loads
 * reads them (sl_json.h), their "stream" and "include_usage" as its
 * pydantic reads a bool (sl_usage_json_bool()); the usage object is parsed
 * by jansson (RFC 8259, UTF-8 checked, depth bounded at 2048). Duplicate
 * keys: the last one wins, as in jansson, Python's json (vLLM, TGI's
 * router is Rust/serde: last wins too) and nlohmann::json (llama.cpp); the
 * request editor therefore edits the last `stream_options` / `include_usage`
 * member, which is the one the runner will see.
 */
#ifndef SL_USAGE_H
#define SL_USAGE_H

#include <stddef.h>
#include <stdint.h>

#include "sl_api.h"

/* Larger non-streamed response bodies are not parsed (no usage; estimate). */
#define SL_USAGE_MAX_JSON (1024 * 1024)
/*
 * Bound on the bytes the scanner keeps for one event: the held bytes of an
 * event that may be the usage event, and the copy of a `usage` object. An
 * event that grows past it is not the usage chunk and is flushed through.
 */
#define SL_USAGE_MAX_EVENT (64 * 1024)

/* Token counts as the runner reported them. */
struct sl_usage {
	int have;                    /* 1: the fields below were reported */
	uint64_t prompt_tokens;
	uint64_t completion_tokens;
	uint64_t total_tokens;       /* as reported; prompt + completion if absent */
};

/*
 * The most prompt or completion tokens one response is believed to have
 * used: ten times the longest context window of any model served today
 * (10M tokens), and far enough below 2^64 that no sum of believed counts
 * wraps a counter. A usage reporting more is a runner's bug or lie: the
 * caller charges the estimate instead (sluice.yaml(5), usage).
 */
#define SL_USAGE_MAX_TOKENS 100000000ULL

/* 1 if u was reported and its prompt and completion counts are believable. */
static inline int
sl_usage_sane(const struct sl_usage *u)
{
	return u->have && u->prompt_tokens <= SL_USAGE_MAX_TOKENS &&
	    u->completion_tokens <= SL_USAGE_MAX_TOKENS;
}

/* ---- 1. request body ---- */

/* What sl_usage_request found; body is owned, free with sl_usage_req_free(). */
struct sl_usage_req {
	int counted;         /* the body is a JSON object: count this request */
	int stream;          /* "stream": true */
	int client_asked;    /* "stream_options": {"include_usage": true} */
	uint64_t prompt_est; /* prompt tokens estimated from the body (below) */
	int injected;        /* body/body_len hold the bytes to send upstream */
	char *body;          /* malloc'd, NUL-terminated (not counted in body_len) */
	size_t body_len;
	size_t edit_off;     /* the edit: at edit_off, edit_del original bytes */
	size_t edit_del;     /* were replaced by the inserted text */
};

/*
 * Call once per chat/completions or completions request body, before it goes
 * upstream. len is already bounded by max_body_bytes. "Streamed" and "asked"
 * are what a runner reads: "stream" and "include_usage" true as
 * sl_usage_json_bool() reads them (1, "true", "yes"...). With inject set, a
 * streamed request whose client did not ask for usage gets
 *   no stream_options            -> ,"stream_options":{"include_usage":true}
 *                                   before the top-level closing brace
 *   "stream_options": null       -> that null replaced by {"include_usage":true}
 *   stream_options without it    -> ,"include_usage":true before its closing brace
 *   "include_usage": any false   -> that value replaced by true
 *                  (false, null, 0, 0.0, "0", "false", "no", "off", "f", "n")
 * (the comma only when the object has members). A stream_options or
 * include_usage of any other type or value is left alone: the runner
 * refuses that request (or answers it as it sees fit).
 * prompt_est, for every counted body: ceil(bytes / 4) of the prompt's text
 * (the UTF-8 bytes of messages[].content strings, of the "text" string of
 * each object in a content array, and of "prompt" as a string or the
 * strings in a "prompt" array) plus one per token id ("prompt" as an array
 * of integers, or of arrays of them). The caller charges it when no usage
 * arrives.
 * A body that is not a JSON object (array, scalar, garbage, empty, invalid
 * UTF-8) gives counted = 0 and is forwarded untouched.
 * Returns 0, or -1 when out of memory (out then says "not injected"; the
 * request can still be forwarded untouched). Always initialises *out.
 */
int sl_usage_request(const char *body, size_t len, int inject, struct sl_usage_req *out);

/*
 * A JSON value (v[0..len), valid JSON as sl_json_object() takes it) read as
 * a bool the way vLLM and SGLang read one (pydantic, lax mode): true, 1,
 * a float equal to 1.0 (1.0, 1e0), and the strings "1", "t", "y", "on",
 * "yes", "true" (any ASCII case, after unescaping) are true; false, null,
 * 0, -0, a float equal to 0.0, and "0", "f", "n", "no", "off", "false" are
 * false. Returns 1 true, 0 false, -1 anything else (a runner refuses it).
 */
int sl_usage_json_bool(const char *v, size_t len);

/*
 * The same for a request body of another metered API (sl_api.h), which is
 * never edited: these APIs report their usage unasked (in a stream too:
 * there is no stream_options), so their streams pass through unchanged.
 * api SL_API_CHAT or SL_API_COMPLETIONS is sl_usage_request(); for the
 * others counted, stream and prompt_est are set (never injected):
 *   responses   stream as above; prompt_est from "instructions" (a string)
 *               and "input": a string, or an array of items, each a string
 *               or an object whose "content" is a string or an array of
 *               parts whose "text" strings count
 *   messages    stream as above; prompt_est from "system" (a string or an
 *               array of blocks' "text") and messages[].content (a string
 *               or an array of blocks' "text")
 *   embeddings  never streamed; prompt_est from "input" read as chat's
 *               "prompt" (a string, strings, token ids: one per id)
 * ceil(bytes / 4) of the text plus one per token id, as for chat.
 * Returns 0 (no memory is allocated: r.body stays NULL).
 */
int sl_usage_request_api(enum sl_api api, const char *body, size_t len,
    struct sl_usage_req *out);

/* Free the new body (if any) and reset *r. Safe on a zeroed struct. */
void sl_usage_req_free(struct sl_usage_req *r);

/* ---- 2. non-streamed response body ---- */

/*
 * Call once with the whole body of a non-streamed 2xx JSON response. Fills u
 * (have = 1) from a top-level "usage" object whose "prompt_tokens" and
 * "completion_tokens" are non-negative integers ("total_tokens" optional, a
 * non-negative integer when present). Returns 0 when found, -1 otherwise
 * (u->have = 0), including for bodies over SL_USAGE_MAX_JSON, which are not
 * parsed.
 */
int sl_usage_from_json(const char *body, size_t len, struct sl_usage *u);

/*
 * A non-streamed 2xx JSON response without usage: the bytes of its
 * choices[].message.content, .reasoning_content, .reasoning,
 * .tool_calls[].function.arguments and choices[].text strings (decoded),
 * for the estimate; 0 for anything else or a body over SL_USAGE_MAX_JSON.
 */
uint64_t sl_usage_json_content(const char *body, size_t len);

/*
 * Both for the body of another API (chat and completions: as above):
 *   responses   "usage": "input_tokens" -> prompt, "output_tokens" ->
 *               completion (both non-negative integers; "total_tokens"
 *               optional); content: output[] items' content[] parts' "text"
 *               and "refusal", summary[] parts' "text", "arguments"
 *   messages    "usage": "input_tokens" plus "cache_creation_input_tokens"
 *               and "cache_read_input_tokens" where they are integers ->
 *               prompt, "output_tokens" -> completion; content: content[]
 *               blocks' "text" and "thinking", and a tool_use block's
 *               "input" as compact JSON
 *   embeddings  "usage": "prompt_tokens" -> prompt, completion 0; content 0
 * A count over SL_USAGE_MAX_TOKENS (or a sum past it) reads as
 * SL_USAGE_MAX_TOKENS + 1: not believed (sl_usage_sane).
 */
int sl_usage_from_json_api(enum sl_api api, const char *body, size_t len,
    struct sl_usage *u);
uint64_t sl_usage_json_content_api(enum sl_api api, const char *body, size_t len);

/* Completion tokens estimated from content bytes: ceil(bytes / 4). */
static inline uint64_t
sl_usage_estimate(uint64_t content_bytes)
{
	return content_bytes / 4 + (content_bytes % 4 != 0);
}

/* ---- 3. SSE scanner ---- */

/*
 * Ranges one feed may return. Each "usage":null member removed (drop mode)
 * starts a new range; a feed that has used all but three stops early and
 * the caller feeds the rest again (as it must for any short return).
 */
#define SL_USAGE_MAX_RANGES 16

struct sl_usage_tpl;            /* private to src/usage_*.c */

/*
 * What to send to the client for one sl_usage_scan_feed() call, in order:
 * first held[0..held_len) (bytes of earlier calls that were held back), then
 * the n ranges of that call's input. Pointers are valid until the next call
 * on the scanner (feed, finish or free): copy them out before.
 */
struct sl_usage_out {
	const char *held;
	size_t held_len;
	size_t n;
	struct {
		size_t off, len;     /* in the input of this call */
	} range[SL_USAGE_MAX_RANGES];
};

/*
 * Per-stream state, embeddable (136 bytes: one 144-byte malloc chunk, as
 * 128 would be); fields are private. The memory it allocates, on demand,
 * kept until sl_usage_scan_free(): the
 * hold buffer (drop mode only: the head of an event whose first data line
 * starts `data: {`, after any other field or comment lines, that
 * spans two feeds before its fate is known, or the few bytes of what may be
 * a "usage":null member; a few hundred bytes in practice) and the copy of a
 * `usage` object; each capped at SL_USAGE_MAX_EVENT.
 */
struct sl_usage_scan {
	uint64_t content_bytes;
	uint64_t prompt, completion, total;
	char *hold;                  /* held event bytes (drop mode) */
	char *cap;                   /* copy of the current usage object */
	uint32_t hold_len, hold_alloc;
	uint32_t cap_len, cap_alloc;
	union {
		struct {             /* chat: a "usage" member to cut, offsets in the held bytes */
			uint32_t mstart, mnull;
		};
		struct {             /* responses, messages (usage_api.c) */
			uint32_t a_pend;     /* content bytes of the event before its type */
			uint8_t a_k1, a_k2;  /* the current member's key at depth 1, 2 */
			uint8_t a_type;      /* the event's type */
			uint8_t a_kind;      /* object/array at depth 1, 2; a key expected */
		};
	};
	uint16_t depth;              /* JSON nesting in the current event's data */
	uint16_t cap_depth;          /* depth at which the usage object closes */
	uint8_t drop, dropped, have, cr;
	uint8_t line, field, hs, lx;
	uint8_t kmask, kpos, key, cnt;
	uint8_t ev;                  /* per-event flags (private) */
	uint8_t top, after_drop, pending_ok, pfx, ux;
	uint8_t mt, mfirst, mpos, first;   /* "usage":null matcher (drop mode) */
	uint8_t capt;                /* a usage object's copy began (event templates) */
	uint8_t keep;                /* sl_usage_scan_keep() */
	uint8_t api;                 /* sl_usage_scan_init_api(): 0 chat's scanner */
	uint8_t a_pf, a_have, a_capd;   /* responses, messages (usage_api.c) */
	struct sl_usage_tpl *tpl;    /* the kept event template, if any */
	uint64_t p_prompt, p_completion, p_total;   /* parsed, not yet committed */
};

/*
 * Set up a scanner for one response body. drop_usage_event: the request was
 * injected (the client did not ask for usage), so the usage event is removed
 * from what the client receives, and so is every `"usage":null` member at
 * the top level of an event's data object: `,"usage":null` (from the comma
 * to the end of null) or, as the object's first member, `"usage":null,`
 * (through the comma after it; `"usage":null` alone when it is the only
 * member). Blanks (space, tab) may surround the colon, the comma and null;
 * the member must lie on one data line and be followed, after blanks, by a
 * comma or the closing brace. Likewise `,"usage":{...}` (from the comma to
 * the object's closing brace; not as the first member) in an event already
 * known not to be the usage event when the member starts (non-empty
 * choices before it: vLLM's continuous_usage_stats, llama.cpp's last
 * chunk); that object is still read, and counts if it is the last usage
 * seen. Allocates nothing.
 */
void sl_usage_scan_init(struct sl_usage_scan *s, int drop_usage_event);

/*
 * Set up a scanner for the event stream of another API (never dropping
 * anything: every feed is one range of all its input, nothing is held).
 * SL_API_RESPONSES and SL_API_MESSAGES get their own lexer (usage_api.c;
 * chat's is untouched by it), any other api is sl_usage_scan_init(s, 0).
 * It reads the event's type from its data's top-level "type" (event:
 * lines are skipped) and builds nothing but the copy of a usage object:
 *   responses  usage: response.usage of the last response.completed,
 *              response.incomplete or response.failed event ("input_tokens"
 *              prompt, "output_tokens" completion, both required); an event
 *              of any size (the completed one carries the whole output):
 *              only the usage object is copied (bounded by
 *              SL_USAGE_MAX_EVENT). Content: the "delta" strings of
 *              response.output_text.delta, response.refusal.delta,
 *              response.reasoning_text.delta,
 *              response.reasoning_summary_text.delta and
 *              response.function_call_arguments.delta (never the *.done
 *              texts or the completed event's output).
 *   messages   prompt: message_start's message.usage "input_tokens" plus
 *              "cache_creation_input_tokens" and "cache_read_input_tokens"
 *              where integers; completion: "output_tokens" of the last
 *              message_delta's top-level usage (cumulative); usage is had
 *              once both came (a message_delta with "input_tokens" gives
 *              the prompt when no message_start did). Content: the "text",
 *              "thinking" and "partial_json" strings of content_block_delta
 *              events' delta (never content_block_start).
 * A usage event counts once it is complete (ended by a blank line, its
 * data one JSON object); content counts as it is relayed, as for chat.
 */
void sl_usage_scan_init_api(struct sl_usage_scan *s, enum sl_api api);

/*
 * The content bytes seen so far (those the estimate counts, for every
 * API: chat's strings, the text deltas above): > 0 once the stream carried
 * content, e.g. for a time to first token. A load; valid after any feed.
 */
static inline uint64_t
sl_usage_scan_content(const struct sl_usage_scan *s)
{
	return s->content_bytes;
}

/*
 * Feed upstream body bytes as they arrive (any split). Returns how many of
 * in[0..len) were consumed (never 0 when len > 0); call again with the rest,
 * after sending what out describes. The consumed bytes are either in out,
 * held inside the scanner (drop mode only: an event whose first data line
 * starts `data: {`, with the id:, event: or comment lines before it, whose
 * fate is not yet known, or what may be a "usage":null member) or dropped
 * (the usage events, the "usage" members). Without drop, out is always
 * exactly one range covering the consumed bytes and nothing is held. Held
 * bytes come back through a later out, or through finish. What out holds is
 * never more than the consumed bytes plus hold_len as it was before the call.
 */
size_t sl_usage_scan_feed(struct sl_usage_scan *s, const char *in, size_t len,
    struct sl_usage_out *out);

/*
 * The upstream body ended (cleanly or not): out gets any held bytes (an
 * unfinished event is never dropped). An event not ended by a blank line
 * does not count, like an SSE client would discard it.
 */
void sl_usage_scan_finish(struct sl_usage_scan *s, struct sl_usage_out *out);

/*
 * After finish (or any time): the last complete event's usage (u->have = 0 if
 * none), and the bytes of the string values the estimate counts (see
 * above: "content", "text", "arguments", "reasoning_content", "reasoning";
 * an escape counts one) seen. Returns u->have.
 */
int sl_usage_scan_result(const struct sl_usage_scan *s, struct sl_usage *u,
    uint64_t *content_bytes);

/* 1 if a usage event was removed from the client's stream (each one is, in drop mode). */
int sl_usage_scan_dropped(const struct sl_usage_scan *s);

/*
 * Whether the scanner may keep a copy of the stream's last ordinary event
 * across feeds (its template: at most SL_USAGE_TEMPLATE bytes and 64 of
 * bookkeeping), so a next event that differs from it only in its token and
 * numbers is taken in one compare instead of a scan (several times fewer
 * instructions). The caller says so for a stream whose events come close
 * together, where that CPU is spent; keep 0 frees the copy. Within one feed
 * the scanner uses the same shortcut without any copy (the Responses and
 * Messages scanners only across feeds, with keep). Default 0.
 */
#define SL_USAGE_TEMPLATE 2048
void sl_usage_scan_keep(struct sl_usage_scan *s, int keep);

/* Release the buffers. The scanner may be initialised again afterwards. */
void sl_usage_scan_free(struct sl_usage_scan *s);

#endif
