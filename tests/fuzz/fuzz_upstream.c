/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * fuzz_upstream: the upstream response path, as libcurl hands it over.
 *
 * Input: bytes 0-1 seed the body's chunk sizes; the rest is what an
 * upstream sends. It is cut into lines after each LF (libcurl's header
 * callback gets one complete line at a time, CRLF or bare LF included; a
 * last line without LF is never delivered) and fed to sl_resp_head_line()
 * until it answers DONE or BAD. Each answer is checked against a model
 * written from the contract in sl_http.h, and a DONE head on its own:
 * status 200-999, a printable reason, a block of "Name: value\r\n" lines
 * with token names, no CR/LF/NUL other than the terminators, no hop-by-hop,
 * Content-Length or X-Accel-Buffering header, none that Connection named.
 *
 * What follows the head is the body. It is cut into pieces (sizes from the
 * seed, as libcurl's write callback would deliver them), framed the way
 * exchange_response.c does (sl_http_chunk_header(), data, CRLF, then "0\r\n\r\n"),
 * de-chunked by a strict decoder and compared with the input. The whole
 * client response (status line, block, the headers the exchange adds, body)
 * is finally parsed by http-parser, which must find the same headers and
 * body.
 */
#include "config.h"

#include <ctype.h>
#include <http_parser.h>
#include <inttypes.h>
#include <strings.h>

#include "sl_http.h"
#include "fuzz.h"

static const char *const dropped[] = {
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
	"proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
	"content-length", "x-accel-buffering", NULL
};

static int
is_dropped(const char *name, size_t nl)
{
	size_t i;

	for (i = 0; dropped[i] != NULL; i++)
		if (strlen(dropped[i]) == nl && strncasecmp(dropped[i], name, nl) == 0)
			return 1;
	return 0;
}

/* The model: what sl_resp_head_line() should make of each line. */
struct model {
	int status;
	char reason[64];
	struct fz_buf block;
	int is_sse, has_cc;
	int chunked;                /* Transfer-Encoding: chunked seen */
	long long cl;               /* Content-Length seen; -1 none */
	char conn[128];             /* names Connection listed: ",a,b," */
	size_t conn_len;
};

static void
model_reset(struct model *m)
{
	m->status = 0;
	m->reason[0] = '\0';
	m->block.len = 0;
	m->is_sse = m->has_cc = m->chunked = 0;
	m->cl = -1;
	m->conn_len = 0;
}

/* Was this name listed in a Connection line? */
static int
model_conn_named(const struct model *m, const char *name, size_t nl)
{
	char want[130];
	size_t i;

	if (m->conn_len == 0 || nl + 2 > sizeof(want))
		return 0;
	want[0] = ',';
	for (i = 0; i < nl; i++)
		want[i + 1] = (char)tolower((unsigned char)name[i]);
	want[nl + 1] = ',';
	for (i = 0; i + nl + 2 <= m->conn_len; i++)
		if (memcmp(m->conn + i, want, nl + 2) == 0)
			return 1;
	return 0;
}

/* At the end of a final head: the lines Connection named go. */
static void
model_drop_named(struct model *m)
{
	struct fz_buf kept = { 0 };
	const char *b = (const char *)m->block.p, *end, *eol, *colon;

	if (m->conn_len == 0 || m->block.len == 0)
		return;
	end = b + m->block.len;
	while (b < end) {
		eol = memchr(b, '\n', (size_t)(end - b));
		eol = eol == NULL ? end : eol + 1;
		colon = memchr(b, ':', (size_t)(eol - b));
		if (colon == NULL || !model_conn_named(m, b, (size_t)(colon - b)))
			fz_add(&kept, b, (size_t)(eol - b));
		b = eol;
	}
	m->block.len = 0;
	if (kept.len > 0)
		fz_add(&m->block, kept.p, kept.len);
	fz_free(&kept);
}

static enum sl_rh_result
model_line(struct model *m, const char *p, size_t n)
{
	size_t i, nl, rl, vl;
	const char *v;

	if (n > 0 && p[n - 1] == '\n')
		n--;
	if (n > 0 && p[n - 1] == '\r')
		n--;
	/* Controls other than HTAB (CR, LF and NUL among them) are refused. */
	for (i = 0; i < n; i++)
		if (((unsigned char)p[i] < 0x20 && p[i] != '\t') ||
		    (unsigned char)p[i] == 0x7f)
			return SL_RH_BAD;
	if (n >= 5 && memcmp(p, "HTTP/", 5) == 0) {
		/* "HTTP/x" SP 3DIGIT [ SP reason ] */
		const char *sp = memchr(p, ' ', n);

		model_reset(m);
		if (sp == NULL)
			return SL_RH_BAD;
		rl = n - (size_t)(sp - p);      /* from the space on */
		if (rl < 4)
			return SL_RH_BAD;
		for (i = 1; i <= 3; i++)
			if (sp[i] < '0' || sp[i] > '9')
				return SL_RH_BAD;
		m->status = atoi((char[4]){ sp[1], sp[2], sp[3], '\0' });
		if (m->status < 100 || (rl > 4 && sp[4] != ' '))
			return SL_RH_BAD;
		sp += 4;
		rl -= 4;
		while (rl > 0 && *sp == ' ') {
			sp++;
			rl--;
		}
		if (rl > sizeof(m->reason) - 1)
			rl = sizeof(m->reason) - 1;
		for (i = 0; i < rl; i++)
			m->reason[i] = sp[i] >= 0x20 && sp[i] < 0x7f ? sp[i] : ' ';
		m->reason[rl] = '\0';
		return SL_RH_MORE;
	}
	if (m->status == 0)
		return SL_RH_BAD;
	if (n == 0) {
		if (m->status >= 200) {
			model_drop_named(m);
			return SL_RH_DONE;
		}
		model_reset(m);
		return SL_RH_MORE;
	}
	if (p[0] == ' ' || p[0] == '\t')
		return SL_RH_BAD;
	for (nl = 0; nl < n && p[nl] != ':'; nl++)
		if (!fz_tchar((unsigned char)p[nl]))
			return SL_RH_BAD;
	if (nl == 0 || nl == n)
		return SL_RH_BAD;
	for (v = p + nl + 1; v < p + n && (*v == ' ' || *v == '\t'); v++)
		;
	for (vl = (size_t)(p + n - v); vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'); vl--)
		;
	/* One decimal length of up to 18 digits, the same on every line. */
	if (nl == 14 && strncasecmp(p, "content-length", 14) == 0) {
		long long cl = 0;

		if (vl == 0 || vl > 18)
			return SL_RH_BAD;
		for (i = 0; i < vl; i++) {
			if (!isdigit((unsigned char)v[i]))
				return SL_RH_BAD;
			cl = cl * 10 + (v[i] - '0');
		}
		if (m->cl >= 0 && m->cl != cl)
			return SL_RH_BAD;
		m->cl = cl;
	}
	/* chunked alone, and once (RFC 9112 6.1). */
	if (nl == 17 && strncasecmp(p, "transfer-encoding", 17) == 0) {
		if (!(vl == 7 && strncasecmp(v, "chunked", 7) == 0) || m->chunked)
			return SL_RH_BAD;
		m->chunked = 1;
	}
	if (nl == 10 && strncasecmp(p, "connection", 10) == 0) {
		for (i = 0; i < vl; ) {
			size_t s0;

			while (i < vl && strchr(", \t", v[i]) != NULL)
				i++;
			for (s0 = i; i < vl && strchr(", \t", v[i]) == NULL; i++)
				;
			if (i == s0)
				continue;
			if (m->conn_len + (i - s0) + 2 > sizeof(m->conn))
				return SL_RH_BAD;
			if (m->conn_len == 0)
				m->conn[m->conn_len++] = ',';
			for (; s0 < i; s0++)
				m->conn[m->conn_len++] = (char)tolower((unsigned char)v[s0]);
			m->conn[m->conn_len++] = ',';
		}
	}
	if (is_dropped(p, nl))
		return SL_RH_MORE;
	if (nl == 12 && strncasecmp(p, "content-type", 12) == 0 &&
	    (size_t)(p + n - v) >= 17 && strncasecmp(v, "text/event-stream", 17) == 0)
		m->is_sse = 1;
	if (nl == 13 && strncasecmp(p, "cache-control", 13) == 0)
		m->has_cc = 1;
	if (m->block.len + n + 2 > SL_RESP_HEAD_MAX)
		return SL_RH_BAD;
	fz_add(&m->block, p, n);
	fz_add(&m->block, "\r\n", 2);
	return SL_RH_MORE;
}

/*
 * A final head on its own terms; returns the number of header lines and
 * sets *skip when http-parser cannot be trusted to read the block back.
 */
static size_t
check_block(const struct sl_resp_head *h, int *skip)
{
	const char *b = h->block, *end, *eol, *colon;
	size_t i, lines = 0;

	fz_check(h->status >= 200 && h->status <= 999, "status", "final status %d", h->status);
	fz_check(memchr(h->reason, '\0', sizeof(h->reason)) != NULL, "reason",
	    "reason not terminated");
	for (i = 0; h->reason[i] != '\0'; i++)
		fz_check(h->reason[i] >= 0x20 && h->reason[i] < 0x7f, "reason",
		    "byte 0x%02x in the reason", (unsigned char)h->reason[i]);
	fz_check(h->len <= SL_RESP_HEAD_MAX && h->len <= h->cap, "block-size",
	    "block of %zu bytes (cap %zu)", h->len, h->cap);
	*skip = 0;
	if (h->len == 0)
		return 0;
	end = b + h->len;
	while (b < end) {
		for (eol = b; eol < end && *eol != '\r' && *eol != '\n' && *eol != '\0'; eol++)
			if (((unsigned char)*eol < 0x20 && *eol != '\t') || *eol == 0x7f)
				*skip = 1;
		fz_check(end - eol >= 2 && eol[0] == '\r' && eol[1] == '\n', "block-crlf",
		    "CR, LF or NUL inside a relayed line (line %zu)", lines + 1);
		for (colon = b; colon < eol && *colon != ':'; colon++)
			fz_check(fz_tchar((unsigned char)*colon), "block-name",
			    "byte 0x%02x in a relayed header name", (unsigned char)*colon);
		fz_check(colon > b && colon < eol, "block-name", "relayed line without 'Name:'");
		fz_check(!is_dropped(b, (size_t)(colon - b)), "block-dropped",
		    "relayed '%.*s'", (int)(colon - b), b);
		/*
		 * http-parser 2.9.4 takes any name starting "Transfer-Encoding"
		 * for that header (uses_transfer_encoding is set on the prefix)
		 * and then reads a 204/304 body to EOF: no use cross-checking.
		 */
		if ((size_t)(colon - b) > 17 && strncasecmp(b, "transfer-encoding", 17) == 0)
			*skip = 1;
		fz_check(sl_http_is_hop_by_hop(b, (size_t)(colon - b)) == 0, "hop-by-hop",
		    "sl_http_is_hop_by_hop disagrees on '%.*s'", (int)(colon - b), b);
		b = eol + 2;
		lines++;
	}
	return lines;
}

/* "%zx\r\n" by hand, to check sl_http_chunk_header() against. */
static size_t
hex_line(char *dst, uint64_t n)
{
	char tmp[20];
	size_t k = 0, i;

	do {
		tmp[k++] = "0123456789abcdef"[n & 15];
		n >>= 4;
	} while (n != 0);
	for (i = 0; i < k; i++)
		dst[i] = tmp[k - 1 - i];
	dst[k++] = '\r';
	dst[k++] = '\n';
	return k;
}

static void
check_chunk_header(size_t n, size_t dstlen)
{
	char got[32], want[32];
	size_t k, wl = hex_line(want, n);

	memset(got, 0x55, sizeof(got));
	k = sl_http_chunk_header(got, dstlen, n);
	if (dstlen > wl)
		fz_check(k == wl && memcmp(got, want, wl) == 0 && got[wl] == '\0',
		    "chunk-header", "chunk header for %zu in %zu bytes", n, dstlen);
	else
		fz_check(k == 0, "chunk-header", "truncated chunk header for %zu reported %zu",
		    n, k);
	fz_check(dstlen >= sizeof(got) || (unsigned char)got[dstlen] == 0x55,
	    "chunk-header", "wrote past %zu bytes", dstlen);
}

/* Strict chunked decoder for what the exchange writes; -1 on any deviation. */
static int
dechunk(const unsigned char *p, size_t len, struct fz_buf *out)
{
	size_t off = 0;

	for (;;) {
		uint64_t n = 0;
		size_t digits = 0;

		while (off < len && digits < 16 && isxdigit(p[off]) && !isupper(p[off])) {
			n = n * 16 + (uint64_t)(isdigit(p[off]) ? p[off] - '0' : p[off] - 'a' + 10);
			off++;
			digits++;
		}
		if (digits == 0 || (digits > 1 && p[off - digits] == '0'))
			return -1;
		if (len - off < 2 || p[off] != '\r' || p[off + 1] != '\n')
			return -1;
		off += 2;
		if (n == 0)
			return len - off == 2 && p[off] == '\r' && p[off + 1] == '\n' ? 0 : -1;
		if (len - off < n + 2)
			return -1;
		fz_add(out, p + off, n);
		off += n;
		if (p[off] != '\r' || p[off + 1] != '\n')
			return -1;
		off += 2;
	}
}

/* http-parser's view of the client response. */
struct seen {
	size_t nfields, nvalues;
	struct fz_buf body;
	int complete;
};

static int
on_field(http_parser *p, const char *at, size_t n)
{
	struct seen *s = p->data;

	(void)at;
	if (s->nfields == s->nvalues)
		s->nfields++;
	(void)n;
	return 0;
}

static int
on_value(http_parser *p, const char *at, size_t n)
{
	struct seen *s = p->data;

	(void)at;
	(void)n;
	s->nvalues = s->nfields;
	return 0;
}

static int
on_body(http_parser *p, const char *at, size_t n)
{
	fz_add(&((struct seen *)p->data)->body, at, n);
	return 0;
}

static int
on_complete(http_parser *p)
{
	((struct seen *)p->data)->complete = 1;
	return 0;
}

static const http_parser_settings client_settings = {
	.on_header_field = on_field,
	.on_header_value = on_value,
	.on_body = on_body,
	.on_message_complete = on_complete,
};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sl_resp_head h;
	struct model m;
	struct fz_buf framed = { 0 }, plain = { 0 }, resp = { 0 };
	enum sl_rh_result got = SL_RH_MORE, want;
	const char *in;
	size_t len, off = 0, n, lines, extra, body_start;
	uint32_t seed;
	char *copy, hdr[24], line[128];
	int skip, body_allowed, k, ok;

	if (size < 2)
		return 0;
	seed = ((uint32_t)data[0] << 8 | data[1]) * 2654435761u | 1;
	in = (const char *)data + 2;
	len = size - 2;
	memset(&h, 0, sizeof(h));
	memset(&m, 0, sizeof(m));

	while (got == SL_RH_MORE) {
		const char *lf = memchr(in + off, '\n', len - off);

		if (lf == NULL)
			break;   /* libcurl delivers complete lines only */
		n = (size_t)(lf + 1 - (in + off));
		if ((copy = malloc(n)) == NULL)
			abort();
		memcpy(copy, in + off, n);
		got = sl_resp_head_line(&h, copy, n);
		free(copy);
		want = model_line(&m, in + off, n);
		off += n;
		if (got != want)
			fz_dump("line", in + off - n, n);
		fz_check(got == want, "model", "sl_resp_head_line answered %d, expected %d",
		    (int)got, (int)want);
		if (got == SL_RH_BAD)
			break;
		fz_check(h.status == m.status && strcmp(h.reason, m.reason) == 0 &&
		    h.len == m.block.len && (h.len == 0 || memcmp(h.block, m.block.p, h.len) == 0) &&
		    h.is_sse == m.is_sse && h.has_cache_control == m.has_cc, "model",
		    "head state differs from the model after a line");
	}
	if (got != SL_RH_DONE)
		goto out;

	lines = check_block(&h, &skip);
	body_start = off;

	/* The body, cut as libcurl's write callback might deliver it. */
	body_allowed = h.status != 204 && h.status != 304;
	while (off < len && body_allowed) {
		uint32_t r = fz_rand(&seed);
		size_t piece = (r & 3) == 0 ? len - off : 1 + (r >> 8) % ((r & 3) == 1 ? 16 : 1024);

		if (piece > len - off)
			piece = len - off;
		n = sl_http_chunk_header(hdr, sizeof(hdr), piece);
		fz_check(n > 0, "chunk-header", "no chunk header for %zu bytes", piece);
		fz_add(&framed, hdr, n);
		fz_add(&framed, in + off, piece);
		fz_add(&framed, "\r\n", 2);
		check_chunk_header(piece, 1 + fz_rand(&seed) % 24);
		off += piece;
	}
	fz_add(&framed, "0\r\n\r\n", 5);
	check_chunk_header((size_t)fz_rand(&seed) << 32 | fz_rand(&seed), 1 + fz_rand(&seed) % 24);
	check_chunk_header(SIZE_MAX, 19);
	check_chunk_header(SIZE_MAX, 18);
	fz_check(dechunk(framed.p, framed.len, &plain) == 0, "dechunk",
	    "the framed body does not decode");
	if (body_allowed)
		fz_check(plain.len == len - body_start &&
		    (plain.len == 0 || memcmp(plain.p, in + body_start, plain.len) == 0),
		    "dechunk", "de-chunked body differs from what the upstream sent");

	/* The client response as exchange_response.c's conn_build_head() writes it. */
	k = snprintf(line, sizeof(line), "HTTP/1.1 %d %s\r\n", h.status,
	    h.reason[0] ? h.reason : "Whatever");
	fz_add(&resp, line, (size_t)k);
	fz_add(&resp, h.block, h.len);
	extra = 2;
	if (body_allowed) {
		fz_add(&resp, "Transfer-Encoding: chunked\r\n", 28);
		extra++;
	}
	fz_add(&resp, "X-Accel-Buffering: no\r\n", 23);
	if (h.is_sse && !h.has_cache_control) {
		fz_add(&resp, "Cache-Control: no-cache\r\n", 25);
		extra++;
	}
	fz_add(&resp, "Connection: keep-alive\r\n\r\n", 26);
	if (body_allowed)
		fz_add(&resp, framed.p, framed.len);
	if (!skip) {
		/*
		 * Skipped when check_block() saw what http-parser misreads: a
		 * control byte other than HTAB (it refuses them; RFC 9110 5.5 lets
		 * sl_resp_head_line() relay them, only CR, LF and NUL are fatal),
		 * or a name extending "Transfer-Encoding".
		 */
		http_parser hp;
		struct seen s;

		memset(&s, 0, sizeof(s));
		http_parser_init(&hp, HTTP_RESPONSE);
		hp.data = &s;
		n = http_parser_execute(&hp, &client_settings, (const char *)resp.p, resp.len);
		ok = HTTP_PARSER_ERRNO(&hp) == HPE_OK && n == resp.len && s.complete &&
		    hp.status_code == h.status && s.nfields == lines + extra &&
		    s.body.len == plain.len &&
		    (plain.len == 0 || memcmp(s.body.p, plain.p, plain.len) == 0);
		if (!ok && !fz_allowed("client-parse"))
			fz_dump("client response", resp.p, resp.len);
		fz_check(ok, "client-parse", "http-parser: %s at %zu of %zu, complete %d, "
		    "status %u, %zu headers (%zu relayed + %zu added), body %zu of %zu",
		    http_errno_name(HTTP_PARSER_ERRNO(&hp)), n, resp.len, s.complete,
		    hp.status_code, s.nfields, lines, extra, s.body.len, plain.len);
		fz_free(&s.body);
	}
out:
	sl_resp_head_free(&h);
	fz_free(&m.block);
	fz_free(&framed);
	fz_free(&plain);
	fz_free(&resp);
	return 0;
}
