/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The SSE usage scanner of src/usage.c as it was at dc4cb72 (one byte at a
 * time, with an eight-byte SWAR skip inside strings), kept verbatim under
 * other names as the reference the fast scanner must agree with: the fuzz
 * target compares the two on every input, and bench/scan_micro times both
 * in the same run. Not part of sluice; nothing in src/ uses it.
 *
 * Deliberate changes since, each made in src/usage_scan.c identically: every
 * usage event is dropped, not only the first (a call ends after a drop,
 * so its two ranges suffice); an event is held through the id:, event:
 * and comment lines before its first data line, which decides; the
 * estimate counts "arguments", "reasoning" and "reasoning_content" strings
 * too; a ,"usage":{...} member in an event known not to be the usage event
 * is listed to cut like ,"usage":null.
 *
 * Built with REF_STRIP (the fuzz target only), it also lists the
 * "usage":null (and usage object) members drop mode cuts (a rule the old
 * scanner did not have), found by looking ahead in the whole input: the
 * fuzz target cuts them from the reference's output. Without it the code
 * is the old one, with the changes listed above.
 */
#ifndef REF_USAGE_H
#define REF_USAGE_H

#include <stddef.h>
#include <stdint.h>

#include "sl_usage.h"

#define REF_MAX_RANGES 2

struct ref_out {
	const char *held;
	size_t held_len;
	size_t n;
	struct {
		size_t off, len;     /* in the input of this call */
	} range[REF_MAX_RANGES];
};

struct ref_scan {
	uint64_t content_bytes;
	uint64_t prompt, completion, total;
	char *hold;                  /* held event bytes (drop mode) */
	char *cap;                   /* copy of the current usage object */
	uint32_t hold_len, hold_alloc;
	uint32_t cap_len, cap_alloc;
	uint16_t depth;              /* JSON nesting in the current event's data */
	uint16_t cap_depth;          /* depth at which the usage object closes */
	uint8_t drop, dropped, have, cr;
	uint8_t line, field, hs, lx;
	uint8_t kmask, kpos, key, cnt;
	uint8_t ev;                  /* per-event flags (private) */
	uint8_t top, after_drop, pending_ok, pfx, ux;
	uint64_t p_prompt, p_completion, p_total;   /* parsed, not yet committed */
#ifdef REF_STRIP
	/*
	 * The "usage" members to cut (drop mode), as offsets in the input,
	 * in order, in the whole input (fed from its start, each call with all
 * that is left).
	 */
	const char *in;
	size_t in_len, at, ev_start, nocand;
	size_t base;                 /* offset of this call's input in the whole */
	int first;
	struct {
		size_t off, len;
	} *spans;
	size_t nspans, spans_cap;
#endif
};

void ref_scan_init(struct ref_scan *s, int drop_usage_event);
size_t ref_scan_feed(struct ref_scan *s, const char *in, size_t len, struct ref_out *out);
void ref_scan_finish(struct ref_scan *s, struct ref_out *out);
int ref_scan_result(const struct ref_scan *s, struct sl_usage *u, uint64_t *content_bytes);
int ref_scan_dropped(const struct ref_scan *s);
void ref_scan_free(struct ref_scan *s);

#endif
