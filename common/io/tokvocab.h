/* tokvocab.h: the text of every token id of a tokenizer directory, to show token
 * sequences to people (prefix tokvocab_). Decoding only: nothing here encodes text (the
 * tokenizers themselves run in scripts/prepare_data.py).
 *
 * A directory holds either tokenizer (byte_tokenizer.json first, as prepare_data.py reads it):
 *   byte_tokenizer.json  this repository's byte vocabulary: ids 0..255 are bytes, read as
 *                        latin-1 characters (what prepare_data.py encodes text with); the ids
 *                        named by its fields bos, eos, user, assistant, pad, mask are special
 *                        tokens shown as <|bos|>, <|eos|>, ...; vocab_size ids in all
 *   tokenizer.json       a Hugging Face byte-level BPE (GPT-2, Llama-3, Qwen2/3): model.type
 *                        "BPE", decoder ByteLevel (or none); each model.vocab key is a string
 *                        of GPT-2's byte characters (a byte <-> printable code point table),
 *                        turned back into its bytes; each added_tokens entry is special text
 *                        shown as it is (its content). An id both in the vocab and added is
 *                        the added token (as transformers decodes it).
 * Ids without an entry (a gap, or past the tokenizer in a larger embedding) have no text.
 *
 * Everything read is checked: ids in [0, TOKVOCAB_MAX_ID), no id twice in model.vocab, a
 * vocab key of byte characters only, integers where ids go. Errors name the file and the
 * field, e.g. `tok/tokenizer.json: model.vocab["\u0100x"]: U+0100 ...`. Returns 0, -EINVAL
 * (bad content), -ENOENT (neither file), -errno, -ENOMEM.
 *
 * tokvocab_print writes bytes for a terminal: valid UTF-8 as it is except control
 * characters (C0 but tab and newline, DEL, C1), which become \xNN / \u00NN, and bytes that
 * are not UTF-8, which become \xNN; so a shard or a tokenizer cannot send escape sequences
 * to the terminal. */
#ifndef DF_TOKVOCAB_H
#define DF_TOKVOCAB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TOKVOCAB_MAX_ID (1 << 24) /* ids at or past this are refused (real vocabularies: < 2^18) */

typedef enum { TOKVOCAB_BYTES, TOKVOCAB_BPE } tokvocab_kind;

typedef struct tokvocab {
    tokvocab_kind kind;
    int n;                /* ids 0..n-1 have a slot (max id + 1) */
    uint32_t *off;        /* [n + 1]: the text of id i is bytes[off[i] .. off[i+1]) */
    unsigned char *bytes; /* every token's text, back to back (UTF-8 for specials) */
    uint8_t *flags;       /* [n]: TOKVOCAB_PRESENT, TOKVOCAB_SPECIAL */
    char path[4200];      /* the file read */
} tokvocab;

#define TOKVOCAB_PRESENT 1u
#define TOKVOCAB_SPECIAL 2u

/* Reads dir/byte_tokenizer.json, else dir/tokenizer.json. */
int tokvocab_load(tokvocab *v, const char *dir, char *err, size_t errlen);
/* The same from json[len] (not NUL-terminated) of the given kind, errors naming `name`. */
int tokvocab_parse(tokvocab *v, const char *json, size_t len, tokvocab_kind kind, const char *name, char *err,
                   size_t errlen);
/* Frees and zeroes; safe on a zeroed struct. */
void tokvocab_free(tokvocab *v);

/* The text of id: 1 and *text, *len set (special: *special = 1) when the id has an entry,
 * else 0. */
int tokvocab_token(const tokvocab *v, uint32_t id, const unsigned char **text, size_t *len, int *special);

/* Writes buf[len] to f as described above; returns the number of escapes written. With
 * TOKVOCAB_ESC_LAYOUT in flags, newline and tab are escaped too (\n, \t: one token a line). */
#define TOKVOCAB_ESC_LAYOUT 1
size_t tokvocab_print(FILE *f, const unsigned char *buf, size_t len, int flags);

/* The GPT-2 byte-level table: the code point that stands for byte b (0..255). */
uint32_t tokvocab_byte_char(int b);

#endif
