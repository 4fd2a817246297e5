/* sample.h: choosing the next token from a row of logits (prefix sample_): greedy, or
 * sampled with temperature, top-k and top-p (nucleus) the way transformers' generate
 * applies them (temperature first, then top-k, then top-p over what is left).
 *
 * Deterministic: the same logits, options and RNG state give the same token on every
 * machine and in every batch layout. Candidates are ordered by probability, ties by the
 * lower token id, and the draw walks that order, so the choice never depends on sort
 * stability or on how many other sequences are decoded beside this one (the caller keeps
 * one RNG per sequence).
 *
 * Exactness of the top-p shortcut: only tokens with p >= p_max * (1 - top_p) / (2V) are
 * sorted. Every token left out is below every candidate and all of them together hold
 * less than (1 - top_p) / 2 of the mass, so the nucleus (the shortest prefix of the sorted
 * distribution with mass >= top_p) lies inside the candidates: the result equals a full
 * sort's, and a peaked distribution sorts a few dozen tokens instead of the vocabulary. */
#ifndef DF_EVAL_SAMPLE_H
#define DF_EVAL_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct sample_opts {
    double temperature; /* 0: greedy (the first largest logit), else > 0 */
    double top_p;       /* (0, 1]; 1: off */
    int top_k;          /* 0: off */
} sample_opts;

/* Scratch for one vocabulary size (reused across calls; not shared between threads). */
typedef struct sample_work {
    int vocab;
    float *prob;   /* [vocab] */
    int32_t *cand; /* [vocab] */
} sample_work;

/* 0 or -ENOMEM / -EINVAL (vocab < 1). */
int sample_work_init(sample_work *w, int vocab, char *err, size_t errlen);
void sample_work_free(sample_work *w);

/* Check options: 0, or -EINVAL with err naming the bad one (name_* are the caller's words
 * for them, e.g. "--top-p"). */
int sample_opts_check(const sample_opts *o, char *err, size_t errlen);

/* The next token for logits[vocab] (not modified). rng is advanced only when sampling. */
int32_t sample_token(const float *logits, const sample_opts *o, df_rng *rng, sample_work *w);

#endif
