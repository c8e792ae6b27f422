/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Upstream HTTP/1.1 framing (sl_upframe.h): the field store, the response
 * parser (http-parser 2.9.4 behind a byte lexer), the request head writer
 * and the chunked body framer.
 *
 * How a feed runs. The lexer goes first over bytes nobody has checked yet
 * and accepts a prefix of them (lex_ahead): in a head it stops after the
 * head's last LF (what follows depends on the head's framing) or before a
 * byte it refuses (lex_bad); in a chunked body it checks the framing
 * exactly and stops after the last CRLF; other bodies it takes whole.
 * http-parser then runs over the accepted prefix only, and pauses where
 * the caller must act: a head complete, a sink's pause, the answer
 * complete. So a refused byte is never seen by http-parser, whatever came
 * before it in the same read, and the outcome does not depend on how the
 * bytes were split into reads.
 */
#include "config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "sl_http.h"
#include "sl_upframe.h"

/* ---- field store ---- */

void
sl_upf_fields_init(struct sl_upf_fields *fs, size_t max)
{
	memset(fs, 0, sizeof(*fs));
	fs->max = max;
}

void
sl_upf_fields_clear(struct sl_upf_fields *fs)
{
	fs->len = 0;
	fs->n = 0;
}

void
sl_upf_fields_free(struct sl_upf_fields *fs)
{
	free(fs->text);
	free(fs->f);
	fs->text = NULL;
	fs->f = NULL;
	fs->len = fs->cap = fs->n = fs->fcap = 0;
}

/* Room for n more text bytes, within max. */
static int
fields_text_room(struct sl_upf_fields *fs, size_t n)
{
	size_t ncap;
	char *nt;

	if (n > fs->max - fs->len || fs->len + n > UINT32_MAX)
		return -1;
	if (fs->len + n <= fs->cap)
		return 0;
	ncap = fs->cap ? fs->cap : 512;
	while (ncap < fs->len + n)
		ncap *= 2;
	if (ncap > fs->max)
		ncap = fs->max;
	if ((nt = realloc(fs->text, ncap)) == NULL)
		return -1;
	fs->text = nt;
	fs->cap = ncap;
	return 0;
}

/* A new empty field at the end of the text. */
static struct sl_upf_field *
fields_new(struct sl_upf_fields *fs)
{
	struct sl_upf_field *f;

	if (fs->n == fs->fcap) {
		size_t nc = fs->fcap ? 2 * fs->fcap : 16;
		struct sl_upf_field *nf;

		if ((nf = realloc(fs->f, nc * sizeof(*nf))) == NULL)
			return NULL;
		fs->f = nf;
		fs->fcap = nc;
	}
	f = &fs->f[fs->n++];
	f->name_off = f->value_off = (uint32_t)fs->len;
	f->name_len = f->value_len = 0;
	return f;
}

/* Append to the last field's name (before any of its value) or value. */
static int
fields_append(struct sl_upf_fields *fs, int to_value, const char *p, size_t n)
{
	struct sl_upf_field *f = &fs->f[fs->n - 1];

	if (fields_text_room(fs, n) == -1)
		return -1;
	if (n > 0)
		memcpy(fs->text + fs->len, p, n);
	fs->len += n;
	if (to_value)
		f->value_len += (uint32_t)n;
	else {
		f->name_len += (uint32_t)n;
		f->value_off = (uint32_t)fs->len;
	}
	return 0;
}

int
sl_upf_fields_add(struct sl_upf_fields *fs, const char *name, size_t nlen,
    const char *value, size_t vlen)
{
	if (nlen + vlen < nlen || fields_text_room(fs, nlen + vlen) == -1 ||
	    fields_new(fs) == NULL)
		return -1;
	if (fields_append(fs, 0, name, nlen) == -1 ||
	    fields_append(fs, 1, value, vlen) == -1) {
		fs->n--;
		return -1;
	}
	return 0;
}

const char *
sl_upf_fields_get(const struct sl_upf_fields *fs, const char *name,
    size_t *vlen)
{
	size_t i;

	for (i = 0; i < fs->n; i++)
		if (sl_http_name_is(fs->text + fs->f[i].name_off,
		    fs->f[i].name_len, name)) {
			*vlen = fs->f[i].value_len;
			return fs->text + fs->f[i].value_off;
		}
	return NULL;
}

int
sl_upf_fields_at(const struct sl_upf_fields *fs, size_t i, const char **name,
    size_t *nlen, const char **value, size_t *vlen)
{
	if (i >= fs->n)
		return -1;
	if (fs->text == NULL) {
		/* Only empty names and values were added. */
		*name = *value = "";
		*nlen = *vlen = 0;
		return 0;
	}
	*name = fs->text + fs->f[i].name_off;
	*nlen = fs->f[i].name_len;
	*value = fs->text + fs->f[i].value_off;
	*vlen = fs->f[i].value_len;
	return 0;
}

/* ---- the byte lexer ---- */

enum lex_mode {
	LM_HEAD = 0,    /* a response head */
	LM_RAW,         /* a body without framing of its own: any byte */
	LM_CHUNK        /* chunked framing, then the trailer section */
};

enum lex_state {
	LX_START = 0,   /* before a status line: CRLFs are skipped */
	LX_START_CR,
	LX_VERSION,     /* "HTTP/1.1": http-parser checks its form */
	LX_CODE,        /* exactly three digits */
	LX_REASON,
	LX_LINE_START,  /* a field line, or the empty line ending the head */
	LX_NAME,
	LX_VALUE,
	LX_CR,          /* CR ending a line: LF must follow */
	LX_END_CR,      /* CR of the empty line */
	LX_END,         /* after the head's (or trailer's) last LF */
	LX_SIZE0,       /* chunk-size: a hex digit first */
	LX_SIZE,
	LX_EXT,         /* chunk extensions: skipped, no controls */
	LX_SIZE_LF,
	LX_DATA,
	LX_DATA_CR,
	LX_DATA_LF,
	LX_RAW          /* LM_RAW: nothing to track */
};

/* What a status line starts with; 'd' is a digit. */
#define VERSION_PAT "HTTP/d.d "

/* A chunk no runner sends; keeps the arithmetic far from overflow. */
#define CHUNK_MAX ((uint64_t)1 << 60)

static int
is_ctl(unsigned char ch)
{
	return (ch < 0x20 && ch != '\t') || ch == 0x7f;
}

static int
hexval(unsigned char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

static void
lex_refuse(struct sl_upf_resp *r, enum sl_upf_error e, const char *why)
{
	r->lex_bad = 1;
	r->lex_err = e;
	r->lex_why = why;
}

/*
 * One byte of a head or a trailer section, in r->lex (<= LX_END). 0, or
 * -1 with the refusal recorded.
 */
static int
lex_head_byte(struct sl_upf_resp *r, unsigned char ch)
{
	size_t k;

	if (++r->lex_head > r->max_header_bytes) {
		lex_refuse(r, SL_UPF_E_HEAD_TOO_LARGE, r->lex_mode == LM_HEAD ?
		    "response head too large" : "response trailer too large");
		return -1;
	}
	if (ch == '\0' || (is_ctl(ch) && ch != '\r' && ch != '\n')) {
		lex_refuse(r, SL_UPF_E_MALFORMED,
		    "control byte in the response head");
		return -1;
	}
	switch (r->lex) {
	case LX_START_CR:
		if (ch != '\n')
			goto bare_cr;
		r->lex = LX_START;
		break;
	case LX_START:
		if (ch == '\r' || ch == '\n') {
			if (ch == '\r')
				r->lex = LX_START_CR;
			break;
		}
		r->lex = LX_VERSION;
		r->lex_digits = 0;
		/* this byte is the version's first */
		/* FALLTHROUGH */
	case LX_VERSION:
		/*
		 * "HTTP/" DIGIT "." DIGIT SP, byte by byte: http-parser as
		 * built checks none of "HTTP/" ("HTP/T1.1" passes).
		 */
		k = (size_t)r->lex_digits++;
		if (VERSION_PAT[k] == 'd' ? !(ch >= '0' && ch <= '9') :
		    ch != (unsigned char)VERSION_PAT[k]) {
			lex_refuse(r, SL_UPF_E_MALFORMED, "malformed status line");
			return -1;
		}
		if (k == sizeof(VERSION_PAT) - 2) {
			r->lex = LX_CODE;
			r->lex_digits = 0;
		}
		break;
	case LX_CODE:
		if (ch >= '0' && ch <= '9') {
			if (++r->lex_digits > 3)
				goto bad_status;
			break;
		}
		if (r->lex_digits != 3 || (ch != ' ' && ch != '\r' && ch != '\n'))
			goto bad_status;
		r->lex = ch == ' ' ? LX_REASON : ch == '\r' ? LX_CR :
		    LX_LINE_START;
		break;
	case LX_REASON:
	case LX_VALUE:
		if (ch == '\r')
			r->lex = LX_CR;
		else if (ch == '\n')
			r->lex = LX_LINE_START;
		break;
	case LX_LINE_START:
		if (ch == ' ' || ch == '\t') {
			lex_refuse(r, SL_UPF_E_MALFORMED, "obsolete line folding");
			return -1;
		}
		if (ch == '\r')
			r->lex = LX_END_CR;
		else if (ch == '\n')
			r->lex = LX_END;
		else if (ch == ':' || !sl_http_is_tchar(ch))
			goto bad_name;
		else
			r->lex = LX_NAME;
		break;
	case LX_NAME:
		if (ch == ':')
			r->lex = LX_VALUE;
		else if (!sl_http_is_tchar(ch))
			goto bad_name;
		break;
	case LX_CR:
	case LX_END_CR:
		if (ch != '\n')
			goto bare_cr;
		r->lex = r->lex == LX_CR ? LX_LINE_START : LX_END;
		break;
	default:
		break;
	}
	return 0;

bare_cr:
	lex_refuse(r, SL_UPF_E_MALFORMED, "CR not followed by LF");
	return -1;
bad_status:
	lex_refuse(r, SL_UPF_E_MALFORMED, "status is not three digits");
	return -1;
bad_name:
	lex_refuse(r, SL_UPF_E_MALFORMED, "invalid header name");
	return -1;
}

/* One byte of chunked framing (not data), in r->lex (> LX_END). 0 or -1. */
static int
lex_chunk_byte(struct sl_upf_resp *r, unsigned char ch)
{
	int h;

	if (++r->lex_line > SL_UPF_CHUNK_LINE_MAX && r->lex != LX_DATA_CR &&
	    r->lex != LX_DATA_LF) {
		lex_refuse(r, SL_UPF_E_MALFORMED, "chunk-size line too long");
		return -1;
	}
	switch (r->lex) {
	case LX_SIZE0:
	case LX_SIZE:
		if ((h = hexval(ch)) >= 0) {
			if (r->lex_chunk >= CHUNK_MAX / 16) {
				lex_refuse(r, SL_UPF_E_MALFORMED,
				    "chunk size too large");
				return -1;
			}
			r->lex_chunk = r->lex_chunk * 16 + (uint64_t)h;
			r->lex = LX_SIZE;
		} else if (r->lex == LX_SIZE0)
			goto bad_chunk;
		else if (ch == ';' || ch == ' ' || ch == '\t')
			r->lex = LX_EXT;
		else if (ch == '\r')
			r->lex = LX_SIZE_LF;
		else
			goto bad_chunk;
		break;
	case LX_EXT:
		if (ch == '\r')
			r->lex = LX_SIZE_LF;
		else if (is_ctl(ch))
			goto bad_chunk;
		break;
	case LX_SIZE_LF:
		if (ch != '\n')
			goto bad_chunk;
		if (r->lex_chunk == 0) {
			/* The last chunk: the trailer section follows. */
			r->lex = LX_LINE_START;
			r->lex_head = 0;
		} else
			r->lex = LX_DATA;
		break;
	case LX_DATA_CR:
		if (ch != '\r')
			goto bad_chunk;
		r->lex = LX_DATA_LF;
		break;
	case LX_DATA_LF:
		if (ch != '\n')
			goto bad_chunk;
		r->lex = LX_SIZE0;
		r->lex_line = 0;
		break;
	default:
		break;
	}
	return 0;

bad_chunk:
	lex_refuse(r, SL_UPF_E_MALFORMED, "malformed chunked framing");
	return -1;
}

/*
 * Accept a prefix of p[0..n): returns its length. Stops before a refused
 * byte (lex_bad set) or after the LF that ends a head or a trailer section
 * (lex == LX_END).
 */
static size_t
lex(struct sl_upf_resp *r, const char *p, size_t n)
{
	size_t i = 0, take;
	unsigned char ch;

	if (r->lex_mode == LM_RAW)
		return n;
	while (i < n && r->lex != LX_END) {
		ch = (unsigned char)p[i];
		if (r->lex == LX_DATA) {
			/* Chunk data: counted, not looked at. */
			take = n - i;
			if (take > r->lex_chunk)
				take = (size_t)r->lex_chunk;
			r->lex_chunk -= take;
			i += take;
			if (r->lex_chunk == 0)
				r->lex = LX_DATA_CR;
			continue;
		}
		if ((r->lex <= LX_END ? lex_head_byte(r, ch) :
		    lex_chunk_byte(r, ch)) == -1)
			return i;
		i++;
	}
	return i;
}

/* ---- response parser ---- */

enum {
	STOP_NONE = 0,
	STOP_INTERIM,   /* a 1xx head is complete */
	STOP_HEAD,      /* a final head is complete */
	STOP_PAUSE,     /* the sink paused */
	STOP_DONE       /* the answer is complete */
};

static int on_message_begin(http_parser *);
static int on_status(http_parser *, const char *, size_t);
static int on_header_field(http_parser *, const char *, size_t);
static int on_header_value(http_parser *, const char *, size_t);
static int on_headers_complete(http_parser *);
static int on_body(http_parser *, const char *, size_t);
static int on_message_complete(http_parser *);

static const http_parser_settings resp_settings = {
	.on_message_begin = on_message_begin,
	.on_status = on_status,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

static void
resp_fail(struct sl_upf_resp *r, enum sl_upf_error e, const char *why)
{
	if (r->state == SL_UPF_ERROR)
		return;
	r->state = SL_UPF_ERROR;
	r->error = e;
	r->why = why;
	r->reusable = 0;
}

/* A callback's failure: recorded, and http-parser stopped at once. */
static int
cb_fail(http_parser *p, enum sl_upf_error e, const char *why)
{
	resp_fail(p->data, e, why);
	http_parser_pause(p, 1);
	return 0;
}

static void
head_forget(struct sl_upf_resp *r)
{
	sl_upf_fields_clear(&r->fields);
	sl_resp_head_reset(&r->meta);
	r->status = 0;
	r->reason[0] = '\0';
	r->reason_len = 0;
	r->last_was_value = 0;
	r->framing = SL_UPF_NO_BODY;
	r->content_length = -1;
}

static void
lex_head_start(struct sl_upf_resp *r)
{
	r->lex_mode = LM_HEAD;
	r->lex = LX_START;
	r->lex_head = 0;
}

void
sl_upf_resp_init(struct sl_upf_resp *r, size_t max_header_bytes,
    int head_request, sl_upf_sink sink, void *arg)
{
	memset(r, 0, sizeof(*r));
	r->max_header_bytes = max_header_bytes;
	r->sink = sink;
	r->sink_arg = arg;
	sl_upf_fields_init(&r->fields, max_header_bytes);
	sl_resp_head_reset(&r->meta);
	sl_upf_resp_reset(r, head_request);
}

void
sl_upf_resp_reset(struct sl_upf_resp *r, int head_request)
{
	http_parser_init(&r->parser, HTTP_RESPONSE);
	r->parser.data = r;
	r->state = SL_UPF_HEAD;
	r->error = SL_UPF_E_NONE;
	r->why = NULL;
	r->head_request = head_request;
	head_forget(r);
	r->http_major = r->http_minor = 0;
	r->reusable = 0;
	r->extra = 0;
	r->interim = 0;
	r->bytes_in = r->body_bytes = 0;
	r->stop = STOP_NONE;
	r->lex_ahead = 0;
	r->lex_line = 0;
	r->lex_digits = 0;
	r->lex_chunk = 0;
	r->lex_bad = 0;
	r->lex_err = SL_UPF_E_NONE;
	r->lex_why = NULL;
	lex_head_start(r);
}

void
sl_upf_resp_free(struct sl_upf_resp *r)
{
	sl_upf_fields_free(&r->fields);
	sl_resp_head_free(&r->meta);
}

static int
on_message_begin(http_parser *p)
{
	head_forget(p->data);
	return 0;
}

/* The reason phrase as sl_resp_head_line() keeps it. */
static int
on_status(http_parser *p, const char *at, size_t n)
{
	struct sl_upf_resp *r = p->data;
	size_t i;

	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)at[i];

		if (r->reason_len == 0 && ch == ' ')
			continue;
		if (r->reason_len + 1 >= sizeof(r->reason))
			break;
		r->reason[r->reason_len++] = (ch >= 0x20 && ch < 0x7f) ?
		    (char)ch : ' ';
	}
	r->reason[r->reason_len] = '\0';
	return 0;
}

static int
on_header_field(http_parser *p, const char *at, size_t n)
{
	struct sl_upf_resp *r = p->data;

	/* Trailer fields (after the last chunk) are dropped. */
	if (p->flags & F_TRAILING)
		return 0;
	if (r->fields.n == 0 || r->last_was_value) {
		if (fields_new(&r->fields) == NULL)
			return cb_fail(p, SL_UPF_E_NOMEM, "out of memory");
		r->last_was_value = 0;
	}
	if (fields_append(&r->fields, 0, at, n) == -1)
		return cb_fail(p, SL_UPF_E_NOMEM, "out of memory");
	return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t n)
{
	struct sl_upf_resp *r = p->data;

	if (p->flags & F_TRAILING)
		return 0;
	if (r->fields.n == 0)
		return cb_fail(p, SL_UPF_E_MALFORMED, "header value without a name");
	r->last_was_value = 1;
	if (fields_append(&r->fields, 1, at, n) == -1)
		return cb_fail(p, SL_UPF_E_NOMEM, "out of memory");
	return 0;
}

/*
 * The head's fields through sl_resp_head_field(), in order, then those
 * Connection named: what may reach the client stays. -1: a bad head.
 */
static int
head_filter(struct sl_upf_resp *r)
{
	struct sl_upf_fields *fs = &r->fields;
	size_t i, k = 0;
	int keep;

	for (i = 0; i < fs->n; i++) {
		struct sl_upf_field *f = &fs->f[i];
		const char *v = fs->text + f->value_off;

		/* RFC 9110 5.5: trailing whitespace is not part of the value. */
		while (f->value_len > 0 && (v[f->value_len - 1] == ' ' ||
		    v[f->value_len - 1] == '\t'))
			f->value_len--;
		keep = sl_resp_head_field(&r->meta, fs->text + f->name_off,
		    f->name_len, v, f->value_len);
		if (keep == -1)
			return -1;
		if (keep)
			fs->f[k++] = *f;
	}
	fs->n = k;
	if (r->meta.conn_len == 0)
		return 0;
	for (i = k = 0; i < fs->n; i++)
		if (!sl_resp_head_conn_named(&r->meta,
		    fs->text + fs->f[i].name_off, fs->f[i].name_len))
			fs->f[k++] = fs->f[i];
	fs->n = k;
	return 0;
}

static int
on_headers_complete(http_parser *p)
{
	struct sl_upf_resp *r = p->data;
	int status = (int)p->status_code;

	r->status = status;
	r->http_major = p->http_major;
	r->http_minor = p->http_minor;
	if (p->http_major != 1)
		return cb_fail(p, SL_UPF_E_UNSUPPORTED, "not an HTTP/1.x answer");
	if (status < 100)
		return cb_fail(p, SL_UPF_E_MALFORMED, "status below 100");
	if (status == 101)
		return cb_fail(p, SL_UPF_E_UNSUPPORTED,
		    "101 Switching Protocols was not asked for");
	/* Interim heads are checked like final ones (as today), then dropped. */
	if (head_filter(r) == -1)
		return cb_fail(p, SL_UPF_E_MALFORMED,
		    "bad field in the response head");
	/* http-parser and the rule read the framing the same way, or no one. */
	if (r->meta.chunked != ((p->flags & F_CHUNKED) != 0) ||
	    (!r->meta.chunked && (r->meta.content_length >= 0 ?
	    (unsigned long long)r->meta.content_length != p->content_length :
	    p->content_length != ULLONG_MAX)))
		return cb_fail(p, SL_UPF_E_MALFORMED, "ambiguous framing");
	r->content_length = r->meta.content_length;
	if (status < 200) {
		if (++r->interim > SL_UPF_MAX_INTERIM)
			return cb_fail(p, SL_UPF_E_UNSUPPORTED,
			    "too many interim responses");
		r->stop = STOP_INTERIM;
		http_parser_pause(p, 1);
		return 1;
	}
	if (r->head_request || status == 204 || status == 304)
		r->framing = SL_UPF_NO_BODY;
	else if (p->flags & F_CHUNKED)
		r->framing = SL_UPF_CHUNKED;
	else if (r->content_length > 0)
		r->framing = SL_UPF_LENGTH;
	else if (r->content_length == 0)
		r->framing = SL_UPF_NO_BODY;
	else
		r->framing = SL_UPF_UNTIL_CLOSE;
	r->stop = STOP_HEAD;
	http_parser_pause(p, 1);
	/* 1: http-parser reads no body, whatever the head says. */
	return r->framing == SL_UPF_NO_BODY;
}

static int
on_body(http_parser *p, const char *at, size_t n)
{
	struct sl_upf_resp *r = p->data;
	int rc;

	if (n == 0)
		return 0;
	r->body_bytes += n;
	rc = r->sink != NULL ? r->sink(r->sink_arg, at, n) : SL_UPF_GO;
	if (rc < 0)
		return cb_fail(p, SL_UPF_E_SINK, "the body's consumer failed");
	if (rc == SL_UPF_PAUSE) {
		r->stop = STOP_PAUSE;
		http_parser_pause(p, 1);
	}
	return 0;
}

static int
on_message_complete(http_parser *p)
{
	struct sl_upf_resp *r = p->data;

	if (r->status < 200)
		return 0;   /* an interim head's end: the next head follows */
	/*
	 * HTTP/1.1 without Connection: close, with a known end. An HTTP/1.0
	 * runner's keep-alive is not trusted (and nothing sluice runs
	 * speaks 1.0).
	 */
	r->reusable = http_should_keep_alive(p) && p->http_major == 1 &&
	    p->http_minor >= 1;
	r->stop = STOP_DONE;
	http_parser_pause(p, 1);
	return 0;
}

static enum sl_upf_error
map_parser_error(enum http_errno e)
{
	return e == HPE_HEADER_OVERFLOW ? SL_UPF_E_HEAD_TOO_LARGE :
	    SL_UPF_E_MALFORMED;
}

/* The lexer and http-parser disagree on where something ended. */
#define DISAGREE "the framing is ambiguous (parser and lexer disagree)"

size_t
sl_upf_resp_feed(struct sl_upf_resp *r, const char *data, size_t len)
{
	size_t off = 0, n, k, run;
	enum http_errno e;

	if (r->state == SL_UPF_DONE) {
		r->extra += len;
		if (len > 0)
			r->reusable = 0;
		return 0;
	}
	if (r->state != SL_UPF_HEAD && r->state != SL_UPF_BODY)
		return 0;
	if (HTTP_PARSER_ERRNO(&r->parser) == HPE_PAUSED)
		http_parser_pause(&r->parser, 0);
	while (off < len) {
		if (r->lex_ahead == 0) {
			if (r->lex_bad) {
				resp_fail(r, r->lex_err, r->lex_why);
				return off;
			}
			if (r->lex == LX_END) {
				/*
				 * The lexer saw a head (or the trailer) end and
				 * http-parser took every byte of it without
				 * stopping there.
				 */
				resp_fail(r, SL_UPF_E_MALFORMED, DISAGREE);
				return off;
			}
			k = lex(r, data + off, len - off);
			r->lex_ahead = k;
			if (k == 0)
				continue;   /* lex_bad, or LX_END: above */
		}
		run = r->lex_ahead < len - off ? r->lex_ahead : len - off;
		r->stop = STOP_NONE;
		n = http_parser_execute(&r->parser, &resp_settings, data + off,
		    run);
		off += n;
		r->lex_ahead -= n;
		r->bytes_in += n;
		if (r->state == SL_UPF_ERROR)
			return off;
		e = HTTP_PARSER_ERRNO(&r->parser);
		if (e != HPE_OK && e != HPE_PAUSED) {
			resp_fail(r, map_parser_error(e), http_errno_description(e));
			return off;
		}
		if (e == HPE_OK) {
			if (n != run) {
				/* Not paused, yet not everything taken. */
				resp_fail(r, SL_UPF_E_MALFORMED, DISAGREE);
				return off;
			}
			continue;
		}
		switch (r->stop) {
		case STOP_INTERIM:
		case STOP_HEAD:
			/* Paused before the head's last LF, which the lexer took. */
			if (r->lex != LX_END || r->lex_ahead != 1) {
				resp_fail(r, SL_UPF_E_MALFORMED, DISAGREE);
				return off;
			}
			if (r->stop == STOP_HEAD) {
				r->state = SL_UPF_HEAD_DONE;
				return off;
			}
			http_parser_pause(&r->parser, 0);
			head_forget(r);
			r->status = 100;   /* until the next head: still interim */
			lex_head_start(r);
			break;
		case STOP_PAUSE:
			return off;
		case STOP_DONE:
			if (r->lex_mode == LM_CHUNK &&
			    (r->lex != LX_END || r->lex_ahead != 0)) {
				resp_fail(r, SL_UPF_E_MALFORMED, DISAGREE);
				return off;
			}
			r->state = SL_UPF_DONE;
			r->lex_ahead = 0;
			r->extra = len - off;
			if (r->extra > 0)
				r->reusable = 0;
			return off;
		default:
			resp_fail(r, SL_UPF_E_MALFORMED, "parser paused unexpectedly");
			return off;
		}
	}
	return off;
}

void
sl_upf_resp_continue(struct sl_upf_resp *r)
{
	if (r->state != SL_UPF_HEAD_DONE)
		return;
	http_parser_pause(&r->parser, 0);
	r->state = SL_UPF_BODY;
	/* The head's last LF is lexed already (lex_ahead 1). */
	if (r->framing == SL_UPF_CHUNKED) {
		r->lex_mode = LM_CHUNK;
		r->lex = LX_SIZE0;
		r->lex_line = 0;
		r->lex_chunk = 0;
	} else {
		r->lex_mode = LM_RAW;
		r->lex = LX_RAW;
	}
}

void
sl_upf_resp_eof(struct sl_upf_resp *r)
{
	switch (r->state) {
	case SL_UPF_DONE:
		r->reusable = 0;
		return;
	case SL_UPF_ERROR:
		return;
	case SL_UPF_BODY:
		if (r->framing == SL_UPF_UNTIL_CLOSE && r->lex_ahead == 0) {
			if (HTTP_PARSER_ERRNO(&r->parser) == HPE_PAUSED)
				http_parser_pause(&r->parser, 0);
			r->stop = STOP_NONE;
			http_parser_execute(&r->parser, &resp_settings, NULL, 0);
			if (r->stop == STOP_DONE) {
				r->state = SL_UPF_DONE;
				r->reusable = 0;
				return;
			}
		}
		break;
	default:
		break;
	}
	if (r->state == SL_UPF_HEAD && r->bytes_in == 0 && r->lex_ahead == 0 &&
	    !r->lex_bad)
		resp_fail(r, SL_UPF_E_CLOSED,
		    "the upstream closed before answering");
	else
		resp_fail(r, SL_UPF_E_TRUNCATED, "the upstream's answer was cut short");
}

const char *
sl_upf_error_str(enum sl_upf_error e)
{
	switch (e) {
	case SL_UPF_E_NONE: return "none";
	case SL_UPF_E_MALFORMED: return "malformed";
	case SL_UPF_E_HEAD_TOO_LARGE: return "head too large";
	case SL_UPF_E_UNSUPPORTED: return "unsupported";
	case SL_UPF_E_CLOSED: return "closed before answering";
	case SL_UPF_E_TRUNCATED: return "truncated";
	case SL_UPF_E_SINK: return "sink failed";
	case SL_UPF_E_NOMEM: return "out of memory";
	}
	return "unknown";
}

/* ---- request writer ---- */

/* Bytes that may stand in a target or a Host value: visible ASCII. */
static int
visible(const char *p, size_t n)
{
	size_t i;

	if (n == 0)
		return 0;
	for (i = 0; i < n; i++)
		if ((unsigned char)p[i] <= 0x20 || (unsigned char)p[i] >= 0x7f)
			return 0;
	return 1;
}

static int
token(const char *p, size_t n)
{
	size_t i;

	if (n == 0)
		return 0;
	for (i = 0; i < n; i++)
		if (!sl_http_is_tchar((unsigned char)p[i]))
			return 0;
	return 1;
}

/* A field the head writer leaves out: framing and hop are its own. */
static int
writer_drops(const char *name, size_t nlen)
{
	return sl_http_is_hop_by_hop(name, nlen) ||
	    sl_http_name_is(name, nlen, "host") ||
	    sl_http_name_is(name, nlen, "content-length") ||
	    sl_http_name_is(name, nlen, "expect");
}

static char *
put(char *o, const char *p, size_t n)
{
	memcpy(o, p, n);
	return o + n;
}

/* Decimal digits of v into o; returns the end. */
static char *
put_u64(char *o, uint64_t v)
{
	char b[20];
	size_t i = sizeof(b);

	do {
		b[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0);
	return put(o, b + i, sizeof(b) - i);
}

char *
sl_upf_req_head(const struct sl_upf_req_spec *s, size_t *len,
    const char **why)
{
	const struct sl_upf_fields *fs = s->fields;
	const char *name, *value;
	size_t nlen, vlen, i, k, total, mlen, hlen;
	char *out, *o;

	mlen = s->method != NULL ? strlen(s->method) : 0;
	hlen = s->host != NULL ? strlen(s->host) : 0;
	if (!token(s->method, mlen)) {
		*why = "method is not a token";
		return NULL;
	}
	if (s->target == NULL || !visible(s->target, s->target_len) ||
	    s->target[0] != '/') {
		*why = "target is not in origin form";
		return NULL;
	}
	if (!visible(s->host, hlen)) {
		*why = "bad Host";
		return NULL;
	}
	/* "M T HTTP/1.1\r\n" "Host: h\r\n" framing, close, "\r\n" */
	total = mlen + 1 + s->target_len + 11 + 6 + hlen + 2 +
	    sizeof("Transfer-Encoding: chunked\r\n") + 16 + 20 +
	    sizeof("Connection: close\r\n") + 2;
	for (i = 0; fs != NULL &&
	    sl_upf_fields_at(fs, i, &name, &nlen, &value, &vlen) == 0; i++) {
		if (!token(name, nlen)) {
			*why = "field name is not a token";
			return NULL;
		}
		for (k = 0; k < vlen; k++)
			if (is_ctl((unsigned char)value[k])) {
				*why = "control byte in a field value";
				return NULL;
			}
		total += nlen + 2 + vlen + 2;
	}
	if ((out = malloc(total + 1)) == NULL) {
		*why = "out of memory";
		return NULL;
	}
	o = put(out, s->method, mlen);
	*o++ = ' ';
	o = put(o, s->target, s->target_len);
	o = put(o, " HTTP/1.1\r\nHost: ", 17);
	o = put(o, s->host, hlen);
	o = put(o, "\r\n", 2);
	for (i = 0; fs != NULL &&
	    sl_upf_fields_at(fs, i, &name, &nlen, &value, &vlen) == 0; i++) {
		if (writer_drops(name, nlen))
			continue;
		o = put(o, name, nlen);
		o = put(o, ": ", vlen > 0 ? 2 : 1);
		o = put(o, value, vlen);
		o = put(o, "\r\n", 2);
	}
	if (s->body == SL_UPF_BODY_LENGTH) {
		o = put(o, "Content-Length: ", 16);
		o = put_u64(o, s->content_length);
		o = put(o, "\r\n", 2);
	} else if (s->body == SL_UPF_BODY_CHUNKED)
		o = put(o, "Transfer-Encoding: chunked\r\n", 28);
	if (s->close)
		o = put(o, "Connection: close\r\n", 19);
	o = put(o, "\r\n", 2);
	*o = '\0';
	*len = (size_t)(o - out);
	return out;
}

int
sl_upf_fields_from_req(struct sl_upf_fields *out, const struct sl_req *r,
    const char *peer, int identity, const char *api_key)
{
	static const char bearer[] = "Bearer ";
	const char *name, *value;
	size_t nlen, vlen, i, xlen = 0, plen = strlen(peer), klen;
	int nxff = 0, rc = -1;
	char *xff = NULL, *x, *auth = NULL;

	sl_upf_fields_clear(out);
	for (i = 0; sl_req_header_at(r, i, &name, &nlen, &value, &vlen) == 0;
	    i++) {
		if (memchr(value, '\0', vlen) != NULL ||
		    memchr(name, '\0', nlen) != NULL)
			goto out;
		if (sl_req_header_dropped_upstream(r, name, nlen))
			continue;
		if (sl_http_name_is(name, nlen, "x-forwarded-for")) {
			/* Repeated lines are one list (RFC 9110 5.3). */
			if (vlen > 0) {
				xlen += (nxff ? 2 : 0) + vlen;
				nxff++;
			}
			continue;
		}
		/* A counted answer is read: the runner must not compress it. */
		if (identity && sl_http_name_is(name, nlen, "accept-encoding"))
			continue;
		if (sl_upf_fields_add(out, name, nlen, value, vlen) == -1)
			goto out;
	}
	if (identity && sl_upf_fields_add(out, "Accept-Encoding", 15,
	    "identity", 8) == -1)
		goto out;
	if (nxff > 0 || plen > 0) {
		if ((xff = malloc(xlen + 2 + plen + 1)) == NULL)
			goto out;
		x = xff;
		nxff = 0;
		for (i = 0; sl_req_header_at(r, i, &name, &nlen, &value,
		    &vlen) == 0; i++) {
			if (!sl_http_name_is(name, nlen, "x-forwarded-for") ||
			    vlen == 0 ||
			    sl_req_header_dropped_upstream(r, name, nlen))
				continue;
			if (nxff++ > 0)
				x = put(x, ", ", 2);
			x = put(x, value, vlen);
		}
		if (nxff > 0)
			x = put(x, ", ", 2);
		x = put(x, peer, plen);
		/* As sl_xfer_headers: a list of hops with an empty peer ends ", ". */
		if (sl_upf_fields_add(out, "X-Forwarded-For", 15, xff,
		    (size_t)(x - xff)) == -1)
			goto out;
	}
	if (api_key != NULL) {
		klen = strlen(api_key);
		if ((auth = malloc(sizeof(bearer) + klen)) == NULL)
			goto out;
		memcpy(auth, bearer, sizeof(bearer) - 1);
		memcpy(auth + sizeof(bearer) - 1, api_key, klen);
		if (sl_upf_fields_add(out, "Authorization", 13, auth,
		    sizeof(bearer) - 1 + klen) == -1)
			goto out;
	}
	rc = 0;
out:
	free(xff);
	free(auth);
	return rc;
}

enum sl_upf_body
sl_upf_req_framing(const struct sl_req *r)
{
	if ((r->method == HTTP_GET && r->body_len == 0) ||
	    r->method == HTTP_HEAD)
		return SL_UPF_BODY_NONE;
	return SL_UPF_BODY_LENGTH;
}

int
sl_upf_chunk(char line[SL_UPF_CHUNK_LINE], const void *p, size_t n,
    struct iovec iov[3])
{
	size_t k;

	if (n == 0) {
		iov[0].iov_base = (void *)(uintptr_t)"0\r\n\r\n";
		iov[0].iov_len = 5;
		return 1;
	}
	k = sl_http_chunk_header(line, SL_UPF_CHUNK_LINE, n);
	iov[0].iov_base = line;
	iov[0].iov_len = k;
	iov[1].iov_base = (void *)(uintptr_t)p;
	iov[1].iov_len = n;
	iov[2].iov_base = (void *)(uintptr_t)"\r\n";
	iov[2].iov_len = 2;
	return 3;
}
