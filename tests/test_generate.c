/* test_generate.c: the target's own responses (eval/generate.h) and the token sampler
 * (eval/sample.h), with fresh random inputs every run (seed printed; GEN_SEED=... replays):
 *   1. sample_token against a plain specification written here (softmax with temperature,
 *      top-k by a full sort, top-p over the renormalised rest, the draw walking the sorted
 *      order): the same token for the same RNG state over many random logit rows and
 *      options, ties included; the top-p shortcut (only tokens above a floor are sorted)
 *      never changes the answer.
 *   2. sampling frequencies follow the distribution: 20000 draws at temperature 1 over 8
 *      tokens, every token within 5 sigma of its probability; top-k 2 draws only the two
 *      most likely; top-p draws only inside the nucleus; temperature 0 is the argmax.
 *   3. generate_one on models/tiny-target, greedy: every response token is the argmax of
 *      the target's logits after the tokens before it (a teacher-forced pass over prompt +
 *      response, one call); it stops on the eos it was given and keeps it; a sampled
 *      response is reproducible from (seed, index) and differs under another seed.
 *   4. generate_batch (3 sequences decoded together, and all 7 prompts as one queue through
 *      them) gives every prompt the response generate_one gives it alone, greedy and
 *      sampled, with an eos ending some early.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval/eval_prompts.h"
#include "eval/generate.h"
#include "eval/sample.h"
#include "target/target_decode.h"
#include "test_helpers.h"
#include "util.h"

#define TARGET "models/tiny-target"

/* ---- the plain specification of sampling ---- */

static const float *spec_p;
static int spec_cmp(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (spec_p[i] != spec_p[j])
        return spec_p[i] > spec_p[j] ? -1 : 1;
    return i - j;
}

static int spec_sample(const float *logits, int V, const sample_opts *o, df_rng *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (o->temperature == 0.0)
        return best;
    float *p = malloc(sizeof(float) * V);
    int *idx = malloc(sizeof(int) * V);
    for (int i = 0; i < V; i++) {
        p[i] = (float)exp(((double)logits[i] - (double)logits[best]) / o->temperature);
        idx[i] = i;
    }
    spec_p = p;
    qsort(idx, V, sizeof *idx, spec_cmp);
    int n = (o->top_k > 0 && o->top_k < V) ? o->top_k : V;
    double total = 0;
    for (int i = 0; i < n; i++)
        total += p[idx[i]];
    double mass = total;
    if (o->top_p < 1.0) {
        int keep = 0;
        mass = 0;
        while (keep < n) {
            mass += p[idx[keep++]];
            if (mass >= o->top_p * total)
                break;
        }
        n = keep;
    }
    /* sample.c adds in the candidate order too; in index order when nothing is cut */
    if (!(o->top_k > 0 && o->top_k < V) && o->top_p >= 1.0) {
        for (int i = 0; i < V; i++)
            idx[i] = i;
    }
    double u = df_rng_uniform(rng) * mass, acc = 0;
    int tok = idx[n - 1];
    for (int i = 0; i < n; i++) {
        acc += p[idx[i]];
        if (u < acc) {
            tok = idx[i];
            break;
        }
    }
    free(p);
    free(idx);
    return tok;
}

static void check_against_spec(df_rng *r)
{
    char err[256];
    for (int trial = 0; trial < 400; trial++) {
        int V = 1 + (int)df_rng_below(r, trial % 4 == 0 ? 3000 : 60);
        float *l = malloc(sizeof(float) * V);
        double scale = 0.5 + 8 * df_rng_uniform(r);
        for (int i = 0; i < V; i++) /* coarse values make ties common */
            l[i] = (float)(trial % 3 == 0 ? floor(df_rng_normal(r) * 2) : df_rng_normal(r) * scale);
        sample_opts o = {trial % 7 == 0 ? 0.0 : 0.2 + 2 * df_rng_uniform(r),
                         trial % 2 ? 1.0 : 0.05 + 0.9 * df_rng_uniform(r),
                         trial % 3 == 1 ? 1 + (int)df_rng_below(r, 40) : 0};
        sample_work w;
        T_ASSERT_RC(sample_work_init(&w, V, err, sizeof err));
        uint64_t seed = df_rng_next(r);
        for (int d = 0; d < 5; d++) {
            df_rng a, b;
            df_rng_seed(&a, seed + d);
            df_rng_seed(&b, seed + d);
            int got = sample_token(l, &o, &a, &w), want = spec_sample(l, V, &o, &b);
            if (got != want) {
                fprintf(stderr, "trial %d: V %d T %g top_p %g top_k %d: sample_token %d, specification %d\n", trial, V,
                        o.temperature, o.top_p, o.top_k, got, want);
                exit(1);
            }
        }
        sample_work_free(&w);
        free(l);
    }
    printf("ok: sample_token == the plain specification (400 random rows, greedy / temperature / top-k / top-p)\n");
}

static void check_frequencies(df_rng *r)
{
    char err[256];
    const int V = 8, N = 20000;
    float l[8];
    for (int i = 0; i < V; i++)
        l[i] = (float)df_rng_normal(r);
    double p[8], z = 0;
    int best = 0;
    for (int i = 0; i < V; i++) {
        p[i] = exp(l[i]);
        z += p[i];
        if (l[i] > l[best])
            best = i;
    }
    sample_work w;
    T_ASSERT_RC(sample_work_init(&w, V, err, sizeof err));
    long cnt[8] = {0};
    sample_opts o = {1.0, 1.0, 0};
    for (int k = 0; k < N; k++)
        cnt[sample_token(l, &o, r, &w)]++;
    for (int i = 0; i < V; i++) {
        double q = p[i] / z, sd = sqrt(N * q * (1 - q));
        if (fabs(cnt[i] - N * q) > 5 * sd + 1) {
            fprintf(stderr, "token %d: %ld draws, expected %.0f +- %.0f\n", i, cnt[i], N * q, sd);
            exit(1);
        }
    }
    /* top-k 2: only the two most likely; top-p: only the nucleus */
    int order[8];
    for (int i = 0; i < V; i++)
        order[i] = i;
    float pf[8];
    for (int i = 0; i < V; i++)
        pf[i] = (float)p[i];
    spec_p = pf;
    qsort(order, V, sizeof *order, spec_cmp);
    double top_p = (p[order[0]] + 0.5 * p[order[1]]) / z; /* nucleus = the two largest */
    sample_opts ok2 = {1.0, 1.0, 2}, op = {1.0, top_p, 0}, og = {0.0, 1.0, 0};
    for (int k = 0; k < 2000; k++) {
        int a = sample_token(l, &ok2, r, &w), b = sample_token(l, &op, r, &w);
        T_ASSERT(a == order[0] || a == order[1]);
        T_ASSERT(b == order[0] || b == order[1]);
        T_ASSERT(sample_token(l, &og, r, &w) == best);
    }
    sample_work_free(&w);
    printf(
        "ok: 20000 draws follow softmax within 5 sigma; top-k 2 and a two-token nucleus stay inside; T=0 is argmax\n");
}

static void check_generation(df_rng *r)
{
    char err[1024];
    generate_target t;
    T_ASSERT_RC(generate_open(&t, "cpu", TARGET, 512, 1, err, sizeof err));
    prompts_list pl = {0};
    T_ASSERT_RC(prompts_load(&pl, "data/tiny/heldout-000.dfs", TARGET, t.vocab, 4, 200, err, sizeof err));
    sample_work w;
    T_ASSERT_RC(sample_work_init(&w, t.vocab, err, sizeof err));
    decode_model *m = t.impl; /* the CPU backend's model, for the teacher-forced check */
    int32_t out[64], out2[64], seq[512];
    for (int i = 0; i < pl.n; i++) {
        generate_opts g = {{0.0, 1.0, 0}, 40, NULL, 0};
        int n, stop;
        T_ASSERT_RC(generate_one(&t, pl.p[i].tokens, pl.p[i].n, &g, NULL, &w, out, &n, &stop, err, sizeof err));
        T_ASSERT(n == 40 && !stop);
        /* teacher forcing: the target over prompt + response[:-1] in one call; the logits
         * of the last n rows pick each response token */
        int np = pl.p[i].n;
        memcpy(seq, pl.p[i].tokens, sizeof(int32_t) * np);
        memcpy(seq + np, out, sizeof(int32_t) * (n - 1));
        decode_reset(m);
        T_ASSERT_RC(decode_extend(m, seq, np + n - 1, n));
        for (int k = 0; k < n; k++)
            if (decode_argmax(m->logits + (size_t)k * t.vocab, t.vocab) != out[k]) {
                fprintf(stderr, "prompt %d: response token %d is %d, the target's argmax is %d\n", i, k, out[k],
                        decode_argmax(m->logits + (size_t)k * t.vocab, t.vocab));
                exit(1);
            }
        /* an eos it meets: the response ends there, eos kept */
        int64_t eos = out[5 + (int)df_rng_below(r, 30)];
        g.eos = &eos;
        g.n_eos = 1;
        T_ASSERT_RC(generate_one(&t, pl.p[i].tokens, np, &g, NULL, &w, out2, &n, &stop, err, sizeof err));
        T_ASSERT(stop && out2[n - 1] == eos && memcmp(out2, out, sizeof(int32_t) * n) == 0);
        for (int k = 0; k < n - 1; k++)
            T_ASSERT(out2[k] != eos);
        /* sampled: reproducible from (seed, index); another seed gives another response */
        generate_opts s = {{0.8, 0.95, 0}, 40, NULL, 0};
        df_rng a;
        int n1, n2, n3;
        generate_rng(&a, 7, (uint64_t)i);
        T_ASSERT_RC(generate_one(&t, pl.p[i].tokens, np, &s, &a, &w, out, &n1, &stop, err, sizeof err));
        generate_rng(&a, 7, (uint64_t)i);
        T_ASSERT_RC(generate_one(&t, pl.p[i].tokens, np, &s, &a, &w, out2, &n2, &stop, err, sizeof err));
        T_ASSERT(n1 == n2 && memcmp(out, out2, sizeof(int32_t) * n1) == 0);
        generate_rng(&a, 8, (uint64_t)i);
        T_ASSERT_RC(generate_one(&t, pl.p[i].tokens, np, &s, &a, &w, out2, &n3, &stop, err, sizeof err));
        T_ASSERT(n3 != n1 || memcmp(out, out2, sizeof(int32_t) * n1) != 0);
    }
    /* a response that cannot fit the cache is refused before anything runs */
    generate_opts big = {{0.0, 1.0, 0}, 512, NULL, 0};
    int n, stop;
    T_ASSERT(generate_one(&t, pl.p[0].tokens, pl.p[0].n, &big, NULL, &w, out, &n, &stop, err, sizeof err) == -ENOSPC);
    printf("ok: %d held-out prompts: greedy responses are the target's argmax token by token, eos stops and is kept, "
           "sampling reproducible per (seed, index)\n",
           pl.n);
    sample_work_free(&w);
    prompts_free(&pl);
    generate_close(&t);
}

/* generate_batch == generate_one for every prompt: greedy and sampled, with an eos that
 * ends some responses early (they sit out while the others go on), prompts of different
 * lengths, a last batch that is not full. */
static void check_batch(df_rng *r)
{
    char err[1024];
    generate_target t1, tb, tx;
    int B = 3;
    T_ASSERT_RC(generate_open(&t1, "cpu", TARGET, 512, 1, err, sizeof err));
    T_ASSERT_RC(generate_open(&tb, "cpu", TARGET, 512, B, err, sizeof err));
    T_ASSERT(generate_open(&tx, "cpu", TARGET, 512, GENERATE_MAX_BATCH + 1, err, sizeof err) == -EINVAL &&
             strstr(err, "--batch"));
    prompts_list pl = {0};
    T_ASSERT_RC(prompts_load(&pl, "data/tiny/heldout-000.dfs", TARGET, t1.vocab, 7, 200, err, sizeof err));
    T_ASSERT(pl.n >= 5);
    sample_work w;
    T_ASSERT_RC(sample_work_init(&w, t1.vocab, err, sizeof err));
    enum { MAXN = 48 };
    int32_t ref[8][MAXN], got[8][MAXN];
    int nref[8], sref[8], early = 0;
    for (int mode = 0; mode < 2; mode++) {
        generate_opts g = {{mode ? 0.9 : 0.0, mode ? 0.9 : 1.0, 0}, 20 + (int)df_rng_below(r, MAXN - 20), NULL, 0};
        int64_t eos = -1;
        for (int i = 0; i < pl.n; i++) { /* one at a time */
            df_rng a;
            generate_rng(&a, 11, (uint64_t)i);
            T_ASSERT_RC(
                generate_one(&t1, pl.p[i].tokens, pl.p[i].n, &g, &a, &w, ref[i], &nref[i], &sref[i], err, sizeof err));
            if (i == 1 && eos < 0) { /* prompt 1 ends early on a token of its own response */
                eos = ref[1][2 + (int)df_rng_below(r, (uint64_t)nref[1] - 3)];
                g.eos = &eos, g.n_eos = 1;
                i = -1; /* again, all of them, with the eos */
            }
        }
        for (int i0 = 0; i0 < pl.n; i0 += B) { /* B at a time */
            generate_item it[3];
            df_rng rr[3];
            int nb = pl.n - i0 < B ? pl.n - i0 : B;
            for (int j = 0; j < nb; j++) {
                generate_rng(&rr[j], 11, (uint64_t)(i0 + j));
                it[j] = (generate_item){
                    .prompt = pl.p[i0 + j].tokens, .n_prompt = pl.p[i0 + j].n, .rng = &rr[j], .out = got[i0 + j]};
            }
            T_ASSERT_RC(generate_batch(&tb, it, nb, &g, &w, err, sizeof err));
            for (int j = 0; j < nb; j++) {
                int i = i0 + j;
                if (it[j].n_out != nref[i] || it[j].stopped != sref[i] ||
                    memcmp(got[i], ref[i], sizeof(int32_t) * (size_t)nref[i]) != 0) {
                    fprintf(stderr,
                            "%s prompt %d: batched response (%d tokens, stopped %d) differs from alone "
                            "(%d tokens, stopped %d)\n",
                            mode ? "sampled" : "greedy", i, it[j].n_out, it[j].stopped, nref[i], sref[i]);
                    exit(1);
                }
                early += sref[i] && nref[i] < g.max_new;
            }
        }
        /* all of them in one call: a queue through the 3 sequences (a prompt that ends hands its
         * sequence to the next, prefilled before the next step) */
        generate_item qi[8];
        df_rng qr[8];
        for (int i = 0; i < pl.n; i++) {
            generate_rng(&qr[i], 11, (uint64_t)i);
            qi[i] = (generate_item){.prompt = pl.p[i].tokens, .n_prompt = pl.p[i].n, .rng = &qr[i], .out = got[i]};
        }
        T_ASSERT_RC(generate_batch(&tb, qi, pl.n, &g, &w, err, sizeof err));
        for (int i = 0; i < pl.n; i++)
            if (qi[i].n_out != nref[i] || qi[i].stopped != sref[i] ||
                memcmp(got[i], ref[i], sizeof(int32_t) * (size_t)nref[i]) != 0) {
                fprintf(stderr, "%s prompt %d: queued response (%d tokens, stopped %d) differs from alone (%d, %d)\n",
                        mode ? "sampled" : "greedy", i, qi[i].n_out, qi[i].stopped, nref[i], sref[i]);
                exit(1);
            }
        T_ASSERT(sref[1] || mode); /* greedy: prompt 1 met its eos for sure */
    }
    T_ASSERT(early >= 1);
    generate_item big = {.prompt = pl.p[0].tokens, .n_prompt = pl.p[0].n, .rng = NULL, .out = got[0]};
    generate_opts huge = {{0.0, 1.0, 0}, 512, NULL, 0};
    T_ASSERT(generate_batch(&tb, &big, 1, &huge, &w, err, sizeof err) == -ENOSPC && strstr(err, "prompt 0"));
    printf("ok: %d prompts decoded %d at a time, and all of them as one queue through %d sequences, == one at a time, "
           "greedy and sampled (%d responses ended early on an eos while the others went on)\n",
           pl.n, B, B, early);
    sample_work_free(&w);
    prompts_free(&pl);
    generate_close(&t1);
    generate_close(&tb);
}

int main(void)
{
    uint64_t seed = getenv("GEN_SEED") ? strtoull(getenv("GEN_SEED"), NULL, 0) : (uint64_t)time(NULL);
    printf("seed %llu (GEN_SEED=%llu replays)\n", (unsigned long long)seed, (unsigned long long)seed);
    df_rng r;
    df_rng_seed(&r, seed);
    check_against_spec(&r);
    check_frequencies(&r);
    check_generation(&r);
    check_batch(&r);
    return 0;
}
