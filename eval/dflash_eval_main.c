/* dflash_eval: how good is a drafter? Greedy speculative decoding with a DFlash drafter
 * against its target, beside plain greedy decoding of the same prompts in the same run:
 * acceptance length tau (docs/dflash_spec.md "Evaluation"), its histogram, tokens/s, time per
 * output token and speedup, and the lossless check (speculative output == plain output
 * token for token). docs/eval.md describes the options, the output and the numbers.
 *
 * Exit codes: 0 done (also when outputs differ: that is reported, see docs/eval.md),
 * 1 temporary failure (out of memory, I/O), 2 bad command line, 100 bad model, drafter
 * or prompt file (the message names the file and the field). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_config.h"
#include "eval/dflash_infer.h"
#include "eval/eval_pair.h"
#include "dflash/dflash_model.h"
#include "eval/eval_prompts.h"
#include "eval/spec_decode.h"
#include "eval/spec_decode_backend.h"
#include "target/target_decode.h"
#include "json_num.h"
#include "util.h"

#define MAX_PROMPT_FILES 16

static void usage(FILE *f)
{
    fprintf(f, "usage: dflash_eval --target DIR --drafter DIR --prompts FILE [options]\n"
               "  --target DIR         the target model (HF Qwen3, Qwen3-MoE or Llama directory)\n"
               "  --drafter DIR        a release-format drafter (config.json + model.safetensors, ours or a\n"
               "                       public DFlashDraftModel one) or one of our checkpoints (root or step dir)\n"
               "  --prompts FILE       chat JSONL (needs DIR/byte_tokenizer.json) or a .dfs token shard;\n"
               "                       repeat for several files. A prompt is a conversation up to its first\n"
               "                       assistant turn\n"
               "  --max-prompts N      evaluate the first N prompts (default 8)\n"
               "  --max-new N          new tokens per prompt (default 128)\n"
               "  --max-prompt-len N   keep the last N tokens of longer prompts (default 1024)\n"
               "  --eos ID             stop at this token (default: the tokenizer's / config's eos; -1: never)\n"
               "  --random-drafter SEED  replace the drafter's weights by a random init (std 0.02, as a fresh\n"
               "                       training run starts) of the same shape: the untrained baseline\n"
               "  --no-plain           skip plain decoding (no speedup, no lossless check)\n"
               "  --batch N            decode N prompts together (default 1, at most 64): plain and speculative,\n"
               "                       a queue (a prompt that finishes hands its slot to the next); each prompt is\n"
               "                       still checked against plain greedy decoding alone\n"
               "  --backend cpu|cuda   where to run (default cpu; cuda needs a CUDA build)\n"
               "  --device N           the CUDA device of --backend cuda (default 0)\n"
               "  --label TEXT         name of this drafter in the table and the JSON\n"
               "  --json PATH          also write every number as JSON\n"
               "  --quiet              no progress line per prompt\n"
               "  --help               this text\n"
               "exit codes: 0 done, 1 temporary failure, 2 bad command line, 100 bad model/drafter/prompts\n");
}

typedef struct prompt_eval {
    spec_result plain, spec;
    spec_result plain_batch; /* --batch > 1: the prompt's plain greedy inside a batch */
    int first_diff;          /* -1: identical outputs (speculative, and the plain batch, vs plain alone) */
    long *acc_hit, *acc_n;   /* [B] teacher-forced per-position accuracy (spec_score_drafts) */
} prompt_eval;

typedef struct eval_opts {
    const char *target, *drafter, *json, *label, *backend;
    const char *prompts[MAX_PROMPT_FILES];
    int n_prompts_files, max_prompts, max_new, max_prompt_len, eos, eos_given, no_plain, quiet;
    int batch;             /* prompts decoded together */
    int device;            /* CUDA device of --backend cuda; -1: not given */
    long long random_seed; /* -1: keep the trained weights */
} eval_opts;

/* an option's integer in [lo, hi] (an int option: hi = INT_MAX, so nothing wraps) */
static int parse_int(const char *s, const char *opt, long long lo, long long hi, long long *out)
{
    if (df_parse_int(s, lo, hi, out) < 0) {
        fprintf(stderr, "dflash_eval: %s: '%s' is not an integer in [%lld, %lld]\n", opt, s, lo, hi);
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, eval_opts *o)
{
    *o = (eval_opts){.max_prompts = 8,
                     .max_new = 128,
                     .max_prompt_len = 1024,
                     .eos = -1,
                     .random_seed = -1,
                     .backend = "cpu",
                     .batch = 1,
                     .device = -1};
    static const struct option opts[] = {{"target", required_argument, 0, 't'},
                                         {"drafter", required_argument, 0, 'd'},
                                         {"prompts", required_argument, 0, 'p'},
                                         {"max-prompts", required_argument, 0, 'n'},
                                         {"max-new", required_argument, 0, 'm'},
                                         {"max-prompt-len", required_argument, 0, 'L'},
                                         {"eos", required_argument, 0, 'e'},
                                         {"random-drafter", required_argument, 0, 'r'},
                                         {"no-plain", no_argument, 0, 'P'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"label", required_argument, 0, 'l'},
                                         {"json", required_argument, 0, 'j'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
                                         {"device", required_argument, 0, 'D'},
                                         {"batch", required_argument, 0, 'B'},
                                         {0, 0, 0, 0}};
    int c;
    long long v;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': o->target = optarg; break;
        case 'd': o->drafter = optarg; break;
        case 'p':
            if (o->n_prompts_files == MAX_PROMPT_FILES) {
                fprintf(stderr, "dflash_eval: at most %d --prompts files\n", MAX_PROMPT_FILES);
                return -1;
            }
            o->prompts[o->n_prompts_files++] = optarg;
            break;
        case 'n':
            if (parse_int(optarg, "--max-prompts", 1, INT_MAX, &v))
                return -1;
            o->max_prompts = (int)v;
            break;
        case 'm':
            if (parse_int(optarg, "--max-new", 1, INT_MAX, &v))
                return -1;
            o->max_new = (int)v;
            break;
        case 'L':
            if (parse_int(optarg, "--max-prompt-len", 1, INT_MAX, &v))
                return -1;
            o->max_prompt_len = (int)v;
            break;
        case 'e':
            if (parse_int(optarg, "--eos", -1, INT_MAX, &v))
                return -1;
            o->eos = (int)v, o->eos_given = 1;
            break;
        case 'r':
            if (parse_int(optarg, "--random-drafter", 0, LLONG_MAX, &v))
                return -1;
            o->random_seed = v;
            break;
        case 'P': o->no_plain = 1; break;
        case 'B':
            if (parse_int(optarg, "--batch", 1, INT_MAX, &v))
                return -1;
            if (v > SPEC_MAX_BATCH) {
                fprintf(stderr, "dflash_eval: --batch: %lld prompts, at most %d are decoded together\n", v,
                        SPEC_MAX_BATCH);
                return -1;
            }
            o->batch = (int)v;
            break;
        case 'b': o->backend = optarg; break;
        case 'D':
            if (parse_int(optarg, "--device", 0, INT_MAX, &v))
                return -1;
            o->device = (int)v;
            break;
        case 'l': o->label = optarg; break;
        case 'j': o->json = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dflash_eval: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->target || !o->drafter || !o->n_prompts_files) {
        fprintf(stderr, "dflash_eval: --target, --drafter and --prompts are required (--help)\n");
        return -1;
    }
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
        fprintf(stderr, "dflash_eval: --backend must be cpu or cuda, got '%s'\n", o->backend);
        return -1;
    }
    if (o->device >= 0 && strcmp(o->backend, "cuda")) {
        fprintf(stderr, "dflash_eval: --device is for --backend cuda\n");
        return -1;
    }
    if (!o->label)
        o->label = o->random_seed >= 0 ? "random init" : o->drafter;
    return 0;
}

static double tpot_ms(const spec_result *r) /* decode time per token after the first */
{
    return r->n_tokens > 1 ? 1e3 * r->decode_s / (r->n_tokens - 1) : 0.0;
}

static json_t *timing_json(const spec_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "new_tokens", json_integer(r->n_tokens));
    json_object_set_new(o, "steps", json_integer(r->n_steps));
    df_json_set_num(o, "prefill_s", r->prefill_s);
    df_json_set_num(o, "decode_s", r->decode_s);
    df_json_set_num(o, "tpot_ms", tpot_ms(r));
    df_json_set_num(o, "tokens_per_s", r->decode_s > 0 && r->n_tokens > 1 ? (r->n_tokens - 1) / r->decode_s : 0.0);
    return o;
}

/* [B] accuracies for positions 0..B-1; position 0 (the anchor) is null */
static json_t *pos_acc_json(const long *hit, const long *n, int B)
{
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    for (int k = 1; k < B; k++)
        json_array_append_new(a, n[k] ? json_real((double)hit[k] / n[k]) : json_null());
    return a;
}

static json_t *pos_n_json(const long *n, int B)
{
    json_t *a = json_array();
    for (int k = 0; k < B; k++)
        json_array_append_new(a, json_integer(k ? n[k] : 0));
    return a;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the per-response taus (the middle response: a few degenerate responses that
 * are drafted perfectly cannot move it). */
static double median_tau(const prompt_eval *pe, int n)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!v)
        df_die(DF_EXIT_TEMP, "out of memory");
    for (int i = 0; i < n; i++)
        v[i] = spec_result_tau(&pe[i].spec);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double m = n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return m;
}

static json_t *hist_json(const long *h, int B)
{
    json_t *a = json_array();
    for (int i = 0; i <= B; i++)
        json_array_append_new(a, json_integer(h[i]));
    return a;
}

/* One evaluation: the options, the drafter, the prompts, the backends, each prompt's
 * results. */
typedef struct eval_run {
    eval_opts o;
    dflash_config dc;
    dflash_params dp;
    int B; /* the drafter's block size */
    prompts_list pl;
    spec_backend be;
    spec_opts so;
    prompt_eval *pe;                    /* [pl.n] */
    double batch_spec_s, batch_plain_s; /* --batch > 1: the queue's decode times */
} eval_run;

/* The figures over every prompt (docs/eval.md). */
typedef struct eval_totals {
    long *hist; /* [B + 1] acceptance lengths */
    double tau, tau_median;
    long steps, acc;
    int mismatches;
    double part_d, part_v, part_a, per_step, plain_step_ms;
    long *pos_hit, *pos_n, *dec_hit, *dec_n; /* [B] per-position accuracy: teacher-forced, in decoding */
    double tpot_p, tpot_s, tpot_pb, speedup;
} eval_totals;

/* The drafter, the target's config (checked against the drafter, the eos, the vocabulary
 * the prompts must keep to), the prompts, then both backends sized for the longest. */
static void load_inputs(eval_run *r)
{
    eval_opts *o = &r->o;
    char err[1024] = "";
    int rc;
    char dcfg[4200];
    if ((rc = pair_load_drafter(o->drafter, &r->dc, &r->dp, dcfg, sizeof dcfg, err, sizeof err)) < 0)
        df_die(rc == -ENOMEM ? DF_EXIT_TEMP : DF_EXIT_PERM, "%s", err);
    if (o->random_seed >= 0)
        dflash_params_init_random(&r->dp, &r->dc, (uint64_t)o->random_seed, 0.02f);
    r->B = r->dc.block_size;

    /* prompts (the target's vocabulary bounds the token ids) */
    hfconfig hc;
    if ((rc = hfconfig_load(&hc, o->target, err, sizeof err)) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    if ((rc = pair_check(&r->dc, &hc, dcfg, o->target, err, sizeof err)) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    if (!o->eos_given) { /* the chat end-of-turn token: byte tokenizer's eos, else config.json's */
        o->eos = prompts_byte_tokenizer_eos(o->target);
        if (o->eos < 0 && hc.n_eos > 0)
            o->eos = (int)hc.eos_token_ids[0];
    }
    prompts_list *pl = &r->pl;
    for (int i = 0; i < o->n_prompts_files && pl->n < o->max_prompts; i++)
        if ((rc = prompts_load(pl, o->prompts[i], o->target, hc.vocab_size, o->max_prompts, o->max_prompt_len, err,
                               sizeof err)) < 0)
            df_die(rc == -ENOMEM ? DF_EXIT_TEMP : DF_EXIT_PERM, "%s", err);
    if (pl->n == 0)
        df_die(DF_EXIT_PERM, "no prompt in %s%s (a prompt needs a user turn followed by an assistant one)",
               o->prompts[0], o->n_prompts_files > 1 ? " and the other --prompts files" : "");
    int longest = 0;
    for (int i = 0; i < pl->n; i++)
        longest = DF_MAX(longest, pl->p[i].n);
    int max_ctx = longest + o->max_new + r->B;
    hfconfig_free(&hc);

    /* backends */
    char kind[32];
    snprintf(kind, sizeof kind, "%s:%d", o->backend, o->device < 0 ? 0 : o->device);
    if ((rc = spec_backend_open_batch(&r->be, strcmp(o->backend, "cuda") ? o->backend : kind, o->target, &r->dc, &r->dp,
                                      max_ctx, o->batch, err, sizeof err)) < 0)
        df_die(rc == -ENOTSUP ? DF_EXIT_USAGE : target_exit_code(rc), "%s", err);

    r->so = (spec_opts){.max_new = o->max_new, .eos = o->eos};
    r->pe = calloc((size_t)pl->n, sizeof *r->pe);
    if (!r->pe)
        df_die(DF_EXIT_TEMP, "out of memory");
}

/* --batch > 1: every prompt through o.batch sequences as one queue (spec_generate_batch:
 * a prompt that finishes hands its sequence to the next), after each prompt's lone plain
 * run (the reference); the queue's decode time */
static void decode_batched(eval_run *r)
{
    const prompts_list *pl = &r->pl;
    int rc;
    const int32_t **bprompts = calloc((size_t)pl->n, sizeof *bprompts);
    int *blens = calloc((size_t)pl->n, sizeof *blens);
    spec_result *bres = calloc((size_t)pl->n, sizeof *bres);
    if (!bprompts || !blens || !bres)
        df_die(DF_EXIT_TEMP, "out of memory");
    for (int i = 0; i < pl->n; i++) {
        const prompts_entry *p = &pl->p[i];
        bprompts[i] = p->tokens, blens[i] = p->n;
        if (!r->o.no_plain && (rc = spec_generate_plain(&r->be.target, p->tokens, p->n, &r->so, &r->pe[i].plain)) < 0)
            df_die(DF_EXIT_TEMP, "%s: plain decoding failed: %s", p->source, strerror(-rc));
    }
    if ((rc = spec_generate_batch(&r->be.target, r->be.drafters, pl->n, bprompts, blens, &r->so, bres, NULL)) < 0)
        df_die(DF_EXIT_TEMP, "%s: batched speculative decoding failed: %s", pl->p[0].source, strerror(-rc));
    r->batch_spec_s = bres[0].decode_s;
    for (int i = 0; i < pl->n; i++)
        r->pe[i].spec = bres[i];
    if (!r->o.no_plain) {
        if ((rc = spec_generate_batch(&r->be.target, NULL, pl->n, bprompts, blens, &r->so, bres, NULL)) < 0)
            df_die(DF_EXIT_TEMP, "%s: batched plain decoding failed: %s", pl->p[0].source, strerror(-rc));
        r->batch_plain_s = bres[0].decode_s;
        for (int i = 0; i < pl->n; i++)
            r->pe[i].plain_batch = bres[i];
    }
    free(bprompts), free(blens), free(bres);
}

/* The first token where b differs from a (a length counts), or keep *first (>= 0 already). */
static void first_difference(const spec_result *a, const spec_result *b, int *first)
{
    int n = DF_MIN(a->n_tokens, b->n_tokens);
    for (int k = 0; k < n && *first < 0; k++)
        if (a->tokens[k] != b->tokens[k])
            *first = k;
    if (*first < 0 && a->n_tokens != b->n_tokens)
        *first = n;
}

/* Prompt i: decoded plain and speculatively (unless the batch did), its drafts scored
 * teacher-forced, its output compared with plain greedy decoding, its progress line. */
static void evaluate_prompt(eval_run *r, int i)
{
    const eval_opts *o = &r->o;
    prompt_eval *e = &r->pe[i];
    const prompts_entry *p = &r->pl.p[i];
    int rc, B = r->B;
    if (o->batch == 1 && !o->no_plain &&
        (rc = spec_generate_plain(&r->be.target, p->tokens, p->n, &r->so, &e->plain)) < 0)
        df_die(DF_EXIT_TEMP, "%s: plain decoding failed: %s", p->source, strerror(-rc));
    if (o->batch == 1 && (rc = spec_generate(&r->be.target, &r->be.drafter, p->tokens, p->n, &r->so, &e->spec)) < 0)
        df_die(DF_EXIT_TEMP, "%s: speculative decoding failed: %s", p->source, strerror(-rc));
    e->first_diff = -1;
    e->acc_hit = calloc((size_t)B, sizeof(long));
    e->acc_n = calloc((size_t)B, sizeof(long));
    if (!e->acc_hit || !e->acc_n)
        df_die(DF_EXIT_TEMP, "out of memory");
    if ((rc = spec_score_drafts(&r->be.target, &r->be.drafter, p->tokens, p->n, e->spec.tokens, e->spec.n_tokens,
                                e->acc_hit, e->acc_n)) < 0)
        df_die(DF_EXIT_TEMP, "%s: scoring the drafts failed: %s", p->source, strerror(-rc));
    if (!o->no_plain) {
        first_difference(&e->plain, &e->spec, &e->first_diff);
        if (o->batch > 1) /* the plain batch must match too */
            first_difference(&e->plain, &e->plain_batch, &e->first_diff);
    }
    if (!o->quiet) {
        fprintf(stderr, "[%d/%d] %s: prompt %d tokens, %d new, tau %.2f", i + 1, r->pl.n, p->source, p->n,
                e->spec.n_tokens, spec_result_tau(&e->spec));
        if (!o->no_plain)
            fprintf(stderr, ", %.3f ms/token plain, %.3f spec, %s", tpot_ms(&e->plain), tpot_ms(&e->spec),
                    e->first_diff < 0 ? "same output" : "OUTPUT DIFFERS");
        fprintf(stderr, "\n");
    }
}

/* overall: tau averaged per response, then across responses (docs/dflash_spec.md) */
static void summarise(const eval_run *r, eval_totals *t)
{
    const eval_opts *o = &r->o;
    const prompt_eval *pe = r->pe;
    int n = r->pl.n, B = r->B;
    memset(t, 0, sizeof *t);
    t->hist = calloc((size_t)B + 1, sizeof(long));
    if (!t->hist)
        df_die(DF_EXIT_TEMP, "out of memory");
    double tau_sum = 0, pd = 0, sd = 0;
    long pn = 0, sn = 0;
    for (int i = 0; i < n; i++) {
        const prompt_eval *e = &pe[i];
        tau_sum += spec_result_tau(&e->spec);
        t->steps += e->spec.n_steps, t->acc += e->spec.accept_sum;
        for (int a = 0; a <= B; a++)
            t->hist[a] += e->spec.hist[a];
        sd += e->spec.decode_s, sn += DF_MAX(e->spec.n_tokens - 1, 0);
        if (!o->no_plain) {
            pd += e->plain.decode_s, pn += DF_MAX(e->plain.n_tokens - 1, 0);
            t->mismatches += e->first_diff >= 0;
        }
    }
    t->tau = tau_sum / n;
    for (int i = 0; i < n; i++) {
        if (o->batch > 1 && i) /* the queue's parts are in each member: count them once */
            break;
        t->part_d += pe[i].spec.draft_s, t->part_v += pe[i].spec.verify_s, t->part_a += pe[i].spec.accept_s;
    }
    long step_count = o->batch > 1 ? pe[0].spec.batch_steps : t->steps; /* --batch > 1: the queue's batched steps */
    t->per_step = step_count ? 1e3 / (double)step_count : 0;            /* seconds -> ms per verify step */
    double plain_step_ms = 0;
    long plain_steps = 0;
    for (int i = 0; i < n && !o->no_plain; i++)
        plain_step_ms += pe[i].plain.decode_s, plain_steps += pe[i].plain.n_steps;
    t->plain_step_ms = plain_steps ? 1e3 * plain_step_ms / (double)plain_steps : 0;
    t->tau_median = median_tau(pe, n);
    /* per-position accuracy, all prompts pooled (spec_decode.h: pos_hit / pos_n) */
    t->pos_hit = calloc((size_t)B, sizeof(long)), t->pos_n = calloc((size_t)B, sizeof(long));
    if (!t->pos_hit || !t->pos_n)
        df_die(DF_EXIT_TEMP, "out of memory");
    t->dec_hit = calloc((size_t)B, sizeof(long)), t->dec_n = calloc((size_t)B, sizeof(long));
    if (!t->dec_hit || !t->dec_n)
        df_die(DF_EXIT_TEMP, "out of memory");
    for (int i = 0; i < n; i++)
        for (int k = 1; k < B; k++) {
            t->pos_hit[k] += pe[i].acc_hit[k], t->pos_n[k] += pe[i].acc_n[k];
            t->dec_hit[k] += pe[i].spec.pos_hit[k], t->dec_n[k] += pe[i].spec.pos_n[k];
        }
    /* --batch > 1: every member's decode_s is the queue's, so time per token = the queue's
     * decode time over all its new tokens (throughput); plain alone stays per prompt */
    if (o->batch > 1)
        sd = r->batch_spec_s;
    t->tpot_p = pn ? 1e3 * pd / pn : 0, t->tpot_s = sn ? 1e3 * sd / sn : 0;
    t->tpot_pb = o->batch > 1 && pn ? 1e3 * r->batch_plain_s / pn : 0;
    t->speedup = t->tpot_s > 0 && t->tpot_p > 0 ? t->tpot_p / t->tpot_s : 0;
}

/* The terminal table and the overall lines. */
static void print_table(const eval_run *r, const eval_totals *t)
{
    const eval_opts *o = &r->o;
    int B = r->B, n = r->pl.n;
    printf("\ndrafter: %s (block size %d)\n", o->label, B);
    printf("%4s  %-34s %6s %5s %6s %12s %12s %8s  %s\n", "#", "prompt", "len", "new", "tau", "plain ms/tok",
           "spec ms/tok", "speedup", "lossless");
    for (int i = 0; i < n; i++) {
        const prompt_eval *e = &r->pe[i];
        const char *src = r->pl.p[i].source;
        size_t sl = strlen(src);
        printf("%4d  %-34s %6d %5d %6.2f", i + 1, sl > 34 ? src + sl - 34 : src, r->pl.p[i].n, e->spec.n_tokens,
               spec_result_tau(&e->spec));
        if (o->no_plain)
            printf(" %12s %12.3f %8s  %s\n", "-", tpot_ms(&e->spec), "-", "-");
        else
            printf(" %12.3f %12.3f %7.2fx  %s\n", tpot_ms(&e->plain), tpot_ms(&e->spec),
                   tpot_ms(&e->spec) > 0 ? tpot_ms(&e->plain) / tpot_ms(&e->spec) : 0.0,
                   e->first_diff < 0 ? "yes" : "NO");
    }
    printf("overall: tau %.3f pooled over %ld verify steps; per response: mean %.3f, median %.3f (%d responses)\n",
           t->steps ? (double)t->acc / t->steps : 0.0, t->steps, t->tau, t->tau_median, n);
    printf("per-position accuracy, every output token as an anchor (k = 1..%d):", B - 1);
    for (int k = 1; k < B; k++)
        printf(" %.2f", t->pos_n[k] ? (double)t->pos_hit[k] / t->pos_n[k] : 0.0);
    printf("\n");
    printf("speculative step, per %s step: draft %.3f ms, verify (%d rows) %.3f ms, accept + append %.3f ms",
           o->batch > 1 ? "batched" : "verify", t->part_d * t->per_step, B * o->batch, t->part_v * t->per_step,
           t->part_a * t->per_step);
    if (!o->no_plain)
        printf("; a plain step %.3f ms (the %sverify costs %.1f plain steps)", t->plain_step_ms,
               o->batch > 1 ? "batched " : "", t->plain_step_ms > 0 ? t->part_v * t->per_step / t->plain_step_ms : 0.0);
    printf("\n");
    printf("acceptance length histogram:");
    for (int a = 1; a <= B; a++)
        printf(" %d:%ld", a, t->hist[a]);
    printf("\n");
    double tpot_p = t->tpot_p, tpot_s = t->tpot_s, tpot_pb = t->tpot_pb;
    if (!o->no_plain)
        printf("decode: plain %.3f ms/token (%.1f tokens/s), speculative %.3f ms/token (%.1f tokens/s), speedup "
               "%.2fx; lossless: %d of %d outputs identical\n",
               tpot_p, tpot_p > 0 ? 1e3 / tpot_p : 0, tpot_s, tpot_s > 0 ? 1e3 / tpot_s : 0, t->speedup,
               n - t->mismatches, n);
    else
        printf("decode: speculative %.3f ms/token (%.1f tokens/s)\n", tpot_s, tpot_s > 0 ? 1e3 / tpot_s : 0);
    if (o->batch > 1) {
        printf("batch of %d: speculative %.1f tokens/s", o->batch, tpot_s > 0 ? 1e3 / tpot_s : 0);
        if (!o->no_plain)
            printf(", plain %.1f tokens/s (%.2fx); plain alone %.1f tokens/s (the speedup above is against it)",
                   tpot_pb > 0 ? 1e3 / tpot_pb : 0, tpot_s > 0 ? tpot_pb / tpot_s : 0, tpot_p > 0 ? 1e3 / tpot_p : 0);
        printf("\n");
    }
}

/* One prompt's object of the --json report. */
static json_t *prompt_json(const eval_run *r, int i)
{
    const prompt_eval *e = &r->pe[i];
    int B = r->B;
    json_t *po = json_object();
    json_object_set_new(po, "source", json_string(r->pl.p[i].source));
    json_object_set_new(po, "prompt_tokens", json_integer(r->pl.p[i].n));
    json_object_set_new(po, "new_tokens", json_integer(e->spec.n_tokens));
    df_json_set_num(po, "tau", spec_result_tau(&e->spec));
    json_object_set_new(po, "hist", hist_json(e->spec.hist, B));
    json_object_set_new(po, "pos_acc", pos_acc_json(e->acc_hit, e->acc_n, B));
    json_object_set_new(po, "pos_acc_in_decode", pos_acc_json(e->spec.pos_hit, e->spec.pos_n, B));
    json_object_set_new(po, "spec", timing_json(&e->spec));
    if (!r->o.no_plain) {
        json_object_set_new(po, "plain", timing_json(&e->plain));
        df_json_set_num(po, "speedup", tpot_ms(&e->spec) > 0 ? tpot_ms(&e->plain) / tpot_ms(&e->spec) : 0.0);
        json_object_set_new(po, "lossless", json_boolean(e->first_diff < 0));
        json_object_set_new(po, "first_diff", json_integer(e->first_diff));
    }
    json_t *toks = json_array();
    for (int k = 0; k < e->spec.n_tokens; k++)
        json_array_append_new(toks, json_integer(e->spec.tokens[k]));
    json_object_set_new(po, "tokens", toks);
    return po;
}

/* The overall object of the --json report. */
static json_t *overall_json(const eval_run *r, const eval_totals *t)
{
    const eval_opts *o = &r->o;
    int B = r->B;
    json_t *ov = json_object();
    json_object_set_new(ov, "n_prompts", json_integer(r->pl.n));
    df_json_set_num(ov, "tau", t->tau);
    df_json_set_num(ov, "tau_token_weighted", t->steps ? (double)t->acc / t->steps : 0.0);
    df_json_set_num(ov, "tau_median", t->tau_median);
    df_json_set_num(ov, "draft_ms_per_step", t->part_d * t->per_step);
    df_json_set_num(ov, "verify_ms_per_step", t->part_v * t->per_step);
    df_json_set_num(ov, "accept_ms_per_step", t->part_a * t->per_step);
    if (!o->no_plain)
        df_json_set_num(ov, "plain_step_ms", t->plain_step_ms);
    json_object_set_new(ov, "pos_acc", pos_acc_json(t->pos_hit, t->pos_n, B));
    json_object_set_new(ov, "pos_n", pos_n_json(t->pos_n, B));
    json_object_set_new(ov, "pos_acc_in_decode", pos_acc_json(t->dec_hit, t->dec_n, B));
    json_object_set_new(ov, "steps", json_integer(t->steps));
    json_object_set_new(ov, "hist", hist_json(t->hist, B));
    df_json_set_num(ov, "spec_tpot_ms", t->tpot_s);
    df_json_set_num(ov, "spec_tokens_per_s", t->tpot_s > 0 ? 1e3 / t->tpot_s : 0);
    if (!o->no_plain) {
        df_json_set_num(ov, "plain_tpot_ms", t->tpot_p);
        df_json_set_num(ov, "plain_tokens_per_s", t->tpot_p > 0 ? 1e3 / t->tpot_p : 0);
        df_json_set_num(ov, "speedup", t->speedup);
        if (o->batch > 1) {
            df_json_set_num(ov, "plain_batch_tpot_ms", t->tpot_pb);
            df_json_set_num(ov, "plain_batch_tokens_per_s", t->tpot_pb > 0 ? 1e3 / t->tpot_pb : 0);
            df_json_set_num(ov, "speedup_over_plain_batch", t->tpot_s > 0 ? t->tpot_pb / t->tpot_s : 0);
        }
        json_object_set_new(ov, "mismatches", json_integer(t->mismatches));
    }
    return ov;
}

/* --json PATH: every number (docs/eval.md). DF_EXIT_OK, or DF_EXIT_TEMP when it cannot be
 * written. */
static int write_json(const eval_run *r, const eval_totals *t)
{
    const eval_opts *o = &r->o;
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "target", json_string(o->target));
    json_object_set_new(root, "drafter", json_string(o->drafter));
    json_object_set_new(root, "label", json_string(o->label));
    json_object_set_new(root, "random_init_seed", o->random_seed >= 0 ? json_integer(o->random_seed) : json_null());
    json_object_set_new(root, "backend", json_string(o->backend));
    json_object_set_new(root, "block_size", json_integer(r->B));
    json_object_set_new(root, "batch", json_integer(o->batch));
    json_object_set_new(root, "max_new", json_integer(o->max_new));
    json_object_set_new(root, "eos", json_integer(o->eos));
    for (int i = 0; i < r->pl.n; i++)
        json_array_append_new(arr, prompt_json(r, i));
    json_object_set_new(root, "prompts", arr);
    json_object_set_new(root, "overall", overall_json(r, t));
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(root);
    int rc = 0, exit_code = DF_EXIT_OK;
    if (!s || (rc = df_write_file_atomic(o->json, s, strlen(s))) < 0) {
        df_log("%s: cannot write: %s", o->json, s ? strerror(-rc) : "out of memory");
        exit_code = DF_EXIT_TEMP;
    }
    free(s);
    return exit_code;
}

static void free_run(eval_run *r, eval_totals *t)
{
    for (int i = 0; i < r->pl.n; i++) {
        spec_result_free(&r->pe[i].plain);
        spec_result_free(&r->pe[i].spec);
        spec_result_free(&r->pe[i].plain_batch);
        free(r->pe[i].acc_hit);
        free(r->pe[i].acc_n);
    }
    free(r->pe);
    free(t->hist);
    free(t->pos_hit);
    free(t->pos_n);
    free(t->dec_hit);
    free(t->dec_n);
    spec_backend_close(&r->be);
    prompts_free(&r->pl);
    dflash_params_free(&r->dp);
}

int main(int argc, char **argv)
{
    df_log_init("dflash_eval");
    static eval_run r;
    eval_opts *o = &r.o;
    if (parse_args(argc, argv, o) < 0)
        return DF_EXIT_USAGE;
    load_inputs(&r);
    fprintf(stderr,
            "dflash_eval: %d prompts, up to %d new tokens each, block size %d, eos %d, backend %s, drafter %s%s\n",
            r.pl.n, o->max_new, r.B, o->eos, o->backend, o->drafter, o->random_seed >= 0 ? " (random init)" : "");
    if (o->batch > 1)
        decode_batched(&r);
    for (int i = 0; i < r.pl.n; i++)
        evaluate_prompt(&r, i);
    eval_totals t;
    summarise(&r, &t);
    print_table(&r, &t);
    int exit_code = o->json ? write_json(&r, &t) : DF_EXIT_OK;
    free_run(&r, &t);
    return exit_code;
}
