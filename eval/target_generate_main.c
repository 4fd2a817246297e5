/* target_generate: the target writes the responses a drafter trains on. It reads prompts
 * (chat JSONL for byte-tokenizer models, or .dfs shards whose samples are cut at their
 * first loss-mask-1 token, as dflash_eval reads them), lets the target answer each one
 * (greedy, or sampled with temperature / top-p / top-k), and writes training shards:
 * per sample the prompt (loss mask 0) followed by the response (loss mask 1, the eos that
 * ended it included). Defaults come from the model's generation_config.json (eos ids,
 * do_sample, temperature, top_p, top_k), as transformers' generate takes them.
 *
 *   target_generate --target DIR --prompts FILE --out PREFIX [options]   (--help)
 *
 * Output: PREFIX-000.dfs, PREFIX-001.dfs, ... (each written atomically, --shard-samples
 * samples each) and PREFIX.json (settings and figures). A prompt's response depends only
 * on the model, the backend, the options and its index (generate.h), so a rerun writes
 * the same shards. Exit codes: 0 done, 1 temporary failure (out of memory, I/O),
 * 2 bad command line, 100 bad model or prompt file (the message names the file). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval_prompts.h"
#include "eval/generate.h"
#include "io/hfconfig.h"
#include "io/shard.h"
#include "json_num.h"
#include "util.h"

/* Prompts one generate_batch call takes, in --batch's: a queue through the --batch
 * sequences, then the responses are written and the progress is logged */
#define GEN_QUEUE_ROUNDS 4

#define MAX_FILES 16
#define MAX_EOS 16

static void usage(FILE *f)
{
    fprintf(f, "usage: target_generate --target DIR --prompts FILE --out PREFIX [options]\n"
               "  --target DIR          the target model (HF Qwen3, Qwen3-MoE or Llama directory)\n"
               "  --prompts FILE        a .dfs shard (each sample up to its first loss-mask-1 token) or chat\n"
               "                        JSONL (byte-tokenizer models only); repeat for several files\n"
               "  --out PREFIX          write PREFIX-000.dfs, PREFIX-001.dfs, ... and PREFIX.json\n"
               "  --backend B           cpu (default), cuda or cuda:N\n"
               "  --batch N             prompts decoded together, 1..64 (default 8): the same responses as\n"
               "                        one at a time, faster (one pass over the weights per step for all);\n"
               "                        a prompt that ends hands its sequence to the next\n"
               "  --max-new N           response tokens at most (default: generation_config's\n"
               "                        max_new_tokens, else 512)\n"
               "  --max-prompts N       answer the first N prompts (default: all)\n"
               "  --max-prompt-len N    keep the last N tokens of longer prompts (default 1024)\n"
               "  --greedy              greedy decoding whatever generation_config.json says\n"
               "  --temperature T       sample with temperature T (0 = greedy)\n"
               "  --top-p P             nucleus sampling share, (0, 1] (default: generation_config's, else 1)\n"
               "  --top-k K             sample among the K most likely (0 = off; default: generation_config's)\n"
               "  --seed S              sampling seed (default 0): prompt i's RNG is a function of (S, i)\n"
               "  --eos ID              stop after this token; repeat for several (default: generation_config's\n"
               "                        eos_token_id, else config.json's, else byte_tokenizer.json's)\n"
               "  --drop-unfinished     leave out responses that reached --max-new without an eos\n"
               "  --shard-samples N     samples per output shard (default 4096)\n"
               "  --quiet               no progress lines\n"
               "  --help                this text\n"
               "exit codes: 0 done, 1 temporary failure, 2 bad command line, 100 bad model or prompts\n");
}

typedef struct gen_args {
    const char *target, *out, *backend;
    const char *prompts[MAX_FILES];
    int n_files, max_new, max_prompts, max_prompt_len, greedy, drop_unfinished, quiet, shard_samples, batch;
    double temperature, top_p; /* < 0: not given */
    int top_k;                 /* < 0: not given */
    unsigned long long seed;
    int64_t eos[MAX_EOS];
    int n_eos;
    char eos_from[4200]; /* where eos came from, for messages: "--eos" or a model file and its field */
} gen_args;

static int num(const char *s, const char *opt, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "target_generate: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, gen_args *a)
{
    static const struct option opts[] = {{"target", 1, 0, 't'},
                                         {"prompts", 1, 0, 'p'},
                                         {"out", 1, 0, 'o'},
                                         {"backend", 1, 0, 'b'},
                                         {"batch", 1, 0, 'B'},
                                         {"max-new", 1, 0, 'n'},
                                         {"max-prompts", 1, 0, 'm'},
                                         {"max-prompt-len", 1, 0, 'l'},
                                         {"greedy", 0, 0, 'g'},
                                         {"temperature", 1, 0, 'T'},
                                         {"top-p", 1, 0, 'P'},
                                         {"top-k", 1, 0, 'K'},
                                         {"seed", 1, 0, 's'},
                                         {"eos", 1, 0, 'e'},
                                         {"drop-unfinished", 0, 0, 'd'},
                                         {"shard-samples", 1, 0, 'S'},
                                         {"quiet", 0, 0, 'q'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (gen_args){.backend = "cpu",
                    .max_prompt_len = 1024,
                    .temperature = -1,
                    .top_p = -1,
                    .top_k = -1,
                    .shard_samples = 4096,
                    .batch = 8};
    int c;
    double v;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': a->target = optarg; break;
        case 'o': a->out = optarg; break;
        case 'b': a->backend = optarg; break;
        case 'p':
            if (a->n_files == MAX_FILES) {
                fprintf(stderr, "target_generate: --prompts: at most %d files\n", MAX_FILES);
                return -1;
            }
            a->prompts[a->n_files++] = optarg;
            break;
        case 'n':
            if (num(optarg, "--max-new", 1, 1 << 20, &v))
                return -1;
            a->max_new = (int)v;
            break;
        case 'm':
            if (num(optarg, "--max-prompts", 1, 1 << 30, &v))
                return -1;
            a->max_prompts = (int)v;
            break;
        case 'l':
            if (num(optarg, "--max-prompt-len", 1, 1 << 20, &v))
                return -1;
            a->max_prompt_len = (int)v;
            break;
        case 'B':
            if (num(optarg, "--batch", 1, GENERATE_MAX_BATCH, &v) || v != (int)v) {
                if (v != (int)v)
                    fprintf(stderr, "target_generate: --batch: '%s' is not a whole number\n", optarg);
                return -1;
            }
            a->batch = (int)v;
            break;
        case 'S':
            if (num(optarg, "--shard-samples", 1, 1 << 30, &v))
                return -1;
            a->shard_samples = (int)v;
            break;
        case 'g': a->greedy = 1; break;
        case 'T':
            if (num(optarg, "--temperature", 0, 100, &a->temperature))
                return -1;
            break;
        case 'P':
            if (num(optarg, "--top-p", 1e-9, 1, &a->top_p))
                return -1;
            break;
        case 'K':
            if (num(optarg, "--top-k", 0, 1 << 30, &v))
                return -1;
            a->top_k = (int)v;
            break;
        case 's':
            if (num(optarg, "--seed", 0, 1.8e19, &v))
                return -1;
            a->seed = (unsigned long long)v;
            break;
        case 'e':
            if (a->n_eos == MAX_EOS) {
                fprintf(stderr, "target_generate: --eos: at most %d ids\n", MAX_EOS);
                return -1;
            }
            if (num(optarg, "--eos", 0, 1 << 30, &v))
                return -1;
            a->eos[a->n_eos++] = (int64_t)v;
            break;
        case 'd': a->drop_unfinished = 1; break;
        case 'q': a->quiet = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "target_generate: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!a->target || !a->out || !a->n_files) {
        fprintf(stderr, "target_generate: --target, --prompts and --out are required (--help)\n");
        return -1;
    }
    if (a->greedy && (a->temperature > 0 || a->top_p >= 0 || a->top_k >= 0)) {
        fprintf(stderr, "target_generate: --greedy cannot go with --temperature / --top-p / --top-k\n");
        return -1;
    }
    return 0;
}

/* the decoding settings: the command line over generation_config.json over greedy */
static int settle(gen_args *a, const char *dir, generate_opts *g, char *err, size_t errlen)
{
    hfconfig_generation gc;
    int rc = hfconfig_load_generation(&gc, dir, err, errlen);
    if (rc < 0)
        return rc;
    sample_opts s = {0.0, 1.0, 0};
    if (gc.do_sample && !a->greedy)
        s = (sample_opts){gc.temperature, gc.top_p, gc.top_k};
    if (a->temperature >= 0)
        s.temperature = a->temperature;
    if (a->top_p >= 0)
        s.top_p = a->top_p;
    if (a->top_k >= 0)
        s.top_k = a->top_k;
    if ((a->top_p >= 0 || a->top_k >= 0) && a->temperature < 0 && !gc.do_sample)
        s.temperature = 1.0; /* asking for top-p / top-k means sampling */
    if ((rc = sample_opts_check(&s, err, errlen)) < 0)
        return rc;
    g->sample = s;
    if (!a->max_new)
        a->max_new = gc.max_new_tokens > 0 ? gc.max_new_tokens : 512;
    g->max_new = a->max_new;
    snprintf(a->eos_from, sizeof a->eos_from, "--eos");
    if (!a->n_eos) { /* generation_config.json, then config.json, then the byte tokenizer */
        for (int i = 0; i < gc.n_eos && a->n_eos < MAX_EOS; i++)
            a->eos[a->n_eos++] = gc.eos_token_ids[i];
        snprintf(a->eos_from, sizeof a->eos_from, "%s/generation_config.json: eos_token_id", dir);
        hfconfig hc;
        if (!a->n_eos && hfconfig_load(&hc, dir, err, errlen) == 0) {
            for (int i = 0; i < hc.n_eos && a->n_eos < MAX_EOS; i++)
                a->eos[a->n_eos++] = hc.eos_token_ids[i];
            hfconfig_free(&hc);
            snprintf(a->eos_from, sizeof a->eos_from, "%s/config.json: eos_token_id", dir);
        }
        int b = a->n_eos ? -1 : prompts_byte_tokenizer_eos(dir);
        if (b >= 0) {
            a->eos[a->n_eos++] = b;
            snprintf(a->eos_from, sizeof a->eos_from, "%s/byte_tokenizer.json: field \"eos\"", dir);
        }
    }
    g->eos = a->eos;
    g->n_eos = a->n_eos;
    return 0;
}

/* the samples of the shard being filled */
typedef struct out_shard {
    uint64_t *off;
    uint32_t *tok;
    uint8_t *mask;
    uint64_t n, cap_s, n_tok, cap_t;
    int index; /* next file number */
} out_shard;

static int shard_add(out_shard *s, const int32_t *p, int np, const int32_t *r, int nr)
{
    if (s->n + 2 > s->cap_s) {
        uint64_t c = s->cap_s ? 2 * s->cap_s : 1024;
        uint64_t *o = realloc(s->off, sizeof *o * c);
        if (!o)
            return -ENOMEM;
        s->off = o;
        s->cap_s = c;
    }
    uint64_t need = s->n_tok + (uint64_t)np + (uint64_t)nr;
    if (need > s->cap_t) {
        uint64_t c = s->cap_t ? s->cap_t : 1 << 16;
        while (c < need)
            c *= 2;
        uint32_t *t = realloc(s->tok, sizeof *t * c);
        if (!t)
            return -ENOMEM;
        s->tok = t;
        uint8_t *m = realloc(s->mask, c);
        if (!m)
            return -ENOMEM;
        s->mask = m;
        s->cap_t = c;
    }
    s->off[0] = 0;
    for (int i = 0; i < np; i++) {
        s->tok[s->n_tok] = (uint32_t)p[i];
        s->mask[s->n_tok++] = 0;
    }
    for (int i = 0; i < nr; i++) {
        s->tok[s->n_tok] = (uint32_t)r[i];
        s->mask[s->n_tok++] = 1;
    }
    s->off[++s->n] = s->n_tok;
    return 0;
}

static int shard_flush(out_shard *s, const char *prefix, uint32_t vocab, char *err, size_t errlen)
{
    if (!s->n)
        return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s-%03d.dfs", prefix, s->index);
    int rc = shard_write(path, vocab, s->n, s->off, s->tok, s->mask);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: cannot write: %s", path, strerror(-rc));
    s->index++;
    s->n = s->n_tok = 0;
    return 0;
}

static int write_summary(const gen_args *a, const generate_opts *g, int prompts, long kept, long stopped, long tokens,
                         int files, double secs, char *err, size_t errlen)
{
    json_t *eos = json_array();
    for (int i = 0; i < g->n_eos; i++)
        json_array_append_new(eos, json_integer(g->eos[i]));
    json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I, s:i, s:o, s:b, s:f, s:f, s:i, s:I}", "target",
                          a->target, "backend", a->backend, "batch", a->batch, "prompts", prompts, "max_new",
                          g->max_new, "samples_written", (json_int_t)kept, "stopped_on_eos", (json_int_t)stopped,
                          "response_tokens", (json_int_t)tokens, "shards", files, "eos", eos, "greedy",
                          g->sample.temperature == 0.0, "temperature", g->sample.temperature, "top_p", g->sample.top_p,
                          "top_k", g->sample.top_k, "seed", (json_int_t)a->seed);
    char path[4200];
    snprintf(path, sizeof path, "%s.json", a->out);
    int rc = -ENOMEM;
    char *text = NULL;
    if (j && df_json_set_num(j, "seconds", secs) == 0 &&
        df_json_set_num(j, "tokens_per_s", secs > 0 ? tokens / secs : 0) == 0 &&
        (text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS)))
        rc = df_write_file_atomic(path, text, strlen(text));
    free(text);
    json_decref(j);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: cannot write: %s", path, strerror(-rc));
    return 0;
}

static int code_of(int rc)
{
    return rc == -ENOMEM || rc == -EIO || rc == -ENOSPC ? DF_EXIT_TEMP : DF_EXIT_PERM;
}

int main(int argc, char **argv)
{
    df_log_init("target_generate");
    gen_args a;
    if (parse_args(argc, argv, &a) < 0)
        return DF_EXIT_USAGE;
    char err[5000] = "";
    generate_opts g;
    int rc = settle(&a, a.target, &g, err, sizeof err);
    if (rc < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    /* the output's folder exists and takes files before any prompt is answered */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", a.out);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if ((rc = df_mkdir_p(dir, 0700)) < 0)
            df_die(DF_EXIT_TEMP, "--out %s: cannot create %s: %s", a.out, dir, strerror(-rc));
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s.json", a.out);
    if ((rc = df_write_file_atomic(probe, "{}\n", 3)) < 0)
        df_die(DF_EXIT_TEMP, "--out %s: cannot write %s: %s", a.out, probe, strerror(-rc));
    generate_target t;
    int max_ctx = a.max_prompt_len + g.max_new;
    if ((rc = generate_open(&t, a.backend, a.target, max_ctx, a.batch, err, sizeof err)) < 0)
        df_die((rc == -EINVAL && strstr(err, "--backend")) || rc == -ENOTSUP ? DF_EXIT_USAGE : code_of(rc), "%s", err);
    for (int i = 0; i < g.n_eos; i++) {
        if (g.eos[i] < t.vocab)
            continue;
        if (!strcmp(a.eos_from, "--eos")) /* a bad option */
            df_die(DF_EXIT_USAGE, "--eos %lld: the vocabulary has %d tokens", (long long)g.eos[i], t.vocab);
        /* the model's own files disagree with its vocabulary: a bad model */
        df_die(DF_EXIT_PERM, "%s: %lld is not a token id: the vocabulary has %d tokens (%s/config.json: vocab_size)",
               a.eos_from, (long long)g.eos[i], t.vocab, a.target);
    }
    prompts_list pl = {0};
    for (int i = 0; i < a.n_files; i++)
        if ((rc = prompts_load(&pl, a.prompts[i], a.target, t.vocab, a.max_prompts ? a.max_prompts : 1 << 30,
                               a.max_prompt_len, err, sizeof err)) < 0)
            df_die(code_of(rc), "%s", err);
    if (!pl.n)
        df_die(DF_EXIT_PERM, "%s: no prompts", a.prompts[0]);
    sample_work w;
    /* prompts go to generate_batch GEN_QUEUE_ROUNDS x --batch at a time: a queue through the
     * --batch sequences (a prompt that ends hands its sequence to the next), so a long
     * response holds up only its own sequence; the chunk bounds the responses held in memory */
    const int chunk = a.batch * GEN_QUEUE_ROUNDS;
    int32_t *resp = malloc(sizeof(int32_t) * (size_t)g.max_new * (size_t)chunk);
    generate_item *items = malloc(sizeof *items * (size_t)chunk);
    df_rng *rngs = malloc(sizeof *rngs * (size_t)chunk);
    if (!resp || !items || !rngs || sample_work_init(&w, t.vocab, err, sizeof err) < 0)
        df_die(DF_EXIT_TEMP, "out of memory");
    df_log("%d prompts, backend %s, batch %d, %s (temperature %g, top-p %g, top-k %d), max %d new tokens, %d eos "
           "id(s)",
           pl.n, a.backend, a.batch, g.sample.temperature > 0 ? "sampled" : "greedy", g.sample.temperature,
           g.sample.top_p, g.sample.top_k, g.max_new, g.n_eos);
    out_shard os = {0};
    long kept = 0, stopped = 0, tokens = 0;
    uint64_t t0 = df_now_ns(), last = t0;
    for (int i0 = 0; i0 < pl.n; i0 += chunk) {
        int nb = pl.n - i0 < chunk ? pl.n - i0 : chunk;
        for (int j = 0; j < nb; j++) {
            generate_rng(&rngs[j], a.seed, (uint64_t)(i0 + j)); /* prompt i's RNG: a function of (seed, i) */
            items[j] = (generate_item){.prompt = pl.p[i0 + j].tokens,
                                       .n_prompt = pl.p[i0 + j].n,
                                       .rng = &rngs[j],
                                       .out = resp + (size_t)j * g.max_new};
        }
        if ((rc = generate_batch(&t, items, nb, &g, &w, err, sizeof err)) < 0)
            df_die(code_of(rc), "prompts %s .. %s: %s", pl.p[i0].source, pl.p[i0 + nb - 1].source, err);
        for (int j = 0; j < nb; j++) { /* in prompt order */
            tokens += items[j].n_out;
            stopped += items[j].stopped;
            if (items[j].stopped || !a.drop_unfinished) {
                if (shard_add(&os, pl.p[i0 + j].tokens, pl.p[i0 + j].n, items[j].out, items[j].n_out) < 0)
                    df_die(DF_EXIT_TEMP, "out of memory");
                kept++;
            }
            if ((int)os.n >= a.shard_samples && (rc = shard_flush(&os, a.out, (uint32_t)t.vocab, err, sizeof err)) < 0)
                df_die(DF_EXIT_TEMP, "%s", err);
        }
        uint64_t now = df_now_ns();
        if (!a.quiet && (now - last > 2000000000ull || i0 + nb == pl.n)) {
            double s = (double)(now - t0) * 1e-9;
            df_log("%d/%d prompts, %ld response tokens, %.0f tok/s", i0 + nb, pl.n, tokens, s > 0 ? tokens / s : 0.0);
            last = now;
        }
    }
    if ((rc = shard_flush(&os, a.out, (uint32_t)t.vocab, err, sizeof err)) < 0)
        df_die(DF_EXIT_TEMP, "%s", err);
    double secs = (double)(df_now_ns() - t0) * 1e-9;
    if ((rc = write_summary(&a, &g, pl.n, kept, stopped, tokens, os.index, secs, err, sizeof err)) < 0)
        df_die(DF_EXIT_TEMP, "%s", err);
    printf("target_generate: %d prompts -> %ld samples in %d shard(s) %s-NNN.dfs; %ld response tokens "
           "(%ld ended on eos) in %.1f s, %.0f tok/s\n",
           pl.n, kept, os.index, a.out, tokens, stopped, secs, secs > 0 ? tokens / secs : 0.0);
    free(resp);
    free(items);
    free(rngs);
    free(os.off);
    free(os.tok);
    free(os.mask);
    sample_work_free(&w);
    prompts_free(&pl);
    generate_close(&t);
    return 0;
}
