/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * A reference reader of multipart/form-data for fuzz_model: what a Python
 * runner serves from a form (vLLM's transcriptions: FastAPI, Starlette,
 * python-multipart), written to follow those readers' own code, with none
 * of src/model.c's strictness. tests/e2e/formrunner.py is the same reading
 * in Python; this is its port, so that the fuzzer can hold sluice to it.
 *
 * Content-Type and Content-Disposition values are read as python-multipart's
 * parse_options_header reads them, which is the email package's get_params:
 * params split at ';' outside quotes (a quote counted unless it is '\"'),
 * names stripped and lowercased, values stripped and unquoted ("..." with
 * \\ and \" undone, or <...>), RFC 2231 (name*, name*0, name*1*...) joined,
 * percent-decoded and moved after the plain ones; the last of a name wins.
 * Strip is Python's str.strip() on latin-1 text (NBSP and NEL included).
 * The body is python-multipart's MultipartParser: leading CR/LF skipped,
 * "--boundary" then CRLF, headers "name: value" (name of token characters,
 * leading spaces of the value skipped, CRLF), an empty line, then data up
 * to "CRLF--boundary" followed by CRLF (another part) or "--" (the end);
 * anything else after it is data. A part cut off by the end never
 * completes. Names are compared as bytes (the charset=utf-8 reading;
 * another charset is only flagged). Starlette keeps a part's last Content-Disposition, requires a
 * name, and FormData keeps the last field of a name.
 */
#ifndef SL_FORM_REF_H
#define SL_FORM_REF_H

#include <stddef.h>

struct form_ref {
	int is_form;            /* the runner reads a form (main type exact) */
	int charset_other;      /* a charset= other than utf-8 or us-ascii:
	                         * Starlette decodes names and values by it */
	int found;              /* a field "model" */
	int file;               /* ... that is an upload (it has a filename) */
	size_t vs, ve;          /* its bytes in the body */
};

/*
 * Read body[0..len) under Content-Type ctype[0..ctlen). 0 with *out set,
 * or -1 where the runner refuses the request (its parser raises).
 */
int form_ref_read(const char *ctype, size_t ctlen, const char *body, size_t len,
    struct form_ref *out);

#endif
