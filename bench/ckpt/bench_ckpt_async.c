/* bench_ckpt_async: what a drafter checkpoint costs the training loop, written in the loop
 * (what the drafter did before, and what a torch.save in a training loop does) or on the
 * writer thread (drafter_worker/ckpt_writer.h, drafter.checkpoint_async), beside the
 * ceiling of the same loop with no checkpoint at all, in one run.
 *
 * The loop: `--steps` real AdamW updates (adamw_step, one thread) over the whole flat
 * parameter buffer of the drafter at `--shape`, a checkpoint every `--every` steps and one
 * at the end, each a real dflash_ckpt_save of the weights and both moments (files, fsync,
 * SHA-256, manifest, `latest`) under `--dir`; older step dirs are pruned as the worker
 * does. On the GPU the step runs on the device and the host has its cores free for the
 * writer; here the step itself is CPU work on one core, so the writer thread competes with
 * it for memory bandwidth and the other cores: an upper bound on what async costs.
 *
 * Columns: wall = the loop's time for all steps and checkpoints (the async run waits for
 * its last write); first / later ckpts = what the loop spent outside its steps for the
 * first checkpoint and (mean) for the later ones before the end (sync: the whole write;
 * async: the snapshot copy, whose first also faults its buffers in, + waiting for a write
 * still in flight); final wait = the end waiting for the last write; write/ckpt = the time
 * dflash_ckpt_save took; of ceiling = ceiling wall / wall.
 * Then the resume side: dflash_manifest_verify of the last checkpoint (the pieces of every
 * file hashed on every core) beside hashing the files one after the other and beside the
 * largest file alone (what a thread a file, version 1 manifests, cannot beat). Writes bench/results/ckpt/async.json (--json to change).
 * Usage: bench_ckpt_async [--shape tiny|1.7b|8b] [--steps N] [--every K] [--dir D] [--json F] */
#include "bench/bench_env.h"
#include "dflash/adamw.h"
#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_manifest.h"
#include "dflash/dflash_model.h"
#include "drafter_worker/ckpt_writer.h"
#include "par.h"
#include "rng_fill.h"
#include "sha256.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>

static char g_err[1024];

static void die_rc(const char *what, int rc)
{
    fprintf(stderr, "bench_ckpt_async: %s failed (%s): %s\n", what, strerror(-rc), g_err);
    exit(1);
}

/* The drafter on the Qwen3-8B target (docs/drafter.md) and on Qwen3-1.7B. */
static void shape(dflash_config *c, const char *name)
{
    dflash_config_tiny(c);
    if (!strcmp(name, "tiny"))
        return;
    c->hidden = 4096, c->intermediate = 12288, c->n_layers = 5, c->n_heads = 32, c->n_kv_heads = 8;
    c->head_dim = 128, c->vocab = 151936, c->block_size = 16, c->n_capture = 5, c->num_target_layers = 36;
    int ids8[5] = {1, 9, 17, 25, 33};
    memcpy(c->target_layer_ids, ids8, sizeof ids8);
    c->mask_token_id = 151669, c->tie_word_embeddings = 0;
    if (!strcmp(name, "1.7b")) {
        c->hidden = 2048, c->intermediate = 6144, c->n_heads = 16, c->n_kv_heads = 8, c->num_target_layers = 28;
        int ids[5] = {1, 7, 13, 19, 25};
        memcpy(c->target_layer_ids, ids, sizeof ids);
        c->tie_word_embeddings = 1;
    } else if (strcmp(name, "8b") != 0) {
        fprintf(stderr, "bench_ckpt_async: --shape takes tiny, 1.7b or 8b, got %s\n", name);
        exit(2);
    }
}

typedef struct run {
    const char *mode; /* "none" (the ceiling), "sync", "async" */
    double wall_s, blocked_s, write_s;
    double snap_s, waitprev_s, final_wait_s; /* async: the parts of blocked_s */
    double first_s, later_s;                 /* blocked at the first checkpoint; summed over the later mid-run ones */
    int ckpts, nlater;
} run;

static void one_run(run *r, const dflash_config *c, dflash_params *p, adamw *opt, float *g, int steps, int every,
                    const char *root)
{
    ckpt_writer w;
    ckpt_writer_init(&w);
    int async = !strcmp(r->mode, "async"), none = !strcmp(r->mode, "none");
    r->blocked_s = r->write_s = r->snap_s = r->waitprev_s = r->final_wait_s = r->first_s = r->later_s = 0;
    r->nlater = 0;
    r->ckpts = 0;
    dflash_train_state ts = {.seed = 1};
    df_rng_seed(&ts.rng, 1);
    double t0 = df_wall_s();
    for (int s = 1; s <= steps; s++) {
        int rc = adamw_step(opt, p->data, g, NULL, 0, NULL);
        if (rc < 0)
            die_rc("adamw_step", rc);
        if (none || (s % every != 0 && s != steps))
            continue;
        double b0 = df_wall_s();
        ts.step = ts.ledger_committed_step = s;
        ckpt_result res;
        if (async && ckpt_writer_collect(&w, 1, NULL, NULL, &res) == 1) { /* the one before, if still going */
            if (res.rc < 0)
                die_rc("async checkpoint", res.rc);
            r->write_s += res.write_s;
            r->waitprev_s += res.wait_s;
        }
        int rc2;
        if (async) {
            double s0 = df_wall_s();
            if ((rc2 = ckpt_writer_start(&w, root, c, p, opt, &ts, 1, g_err, sizeof g_err)) < 0)
                die_rc("ckpt_writer_start", rc2);
            r->snap_s += df_wall_s() - s0;
        } else {
            double w0 = df_wall_s();
            if ((rc2 = dflash_ckpt_save(root, c, p, opt, &ts, g_err, sizeof g_err)) < 0)
                die_rc("dflash_ckpt_save", rc2);
            r->write_s += df_wall_s() - w0;
        }
        double bl = df_wall_s() - b0;
        r->blocked_s += bl;
        if (r->ckpts == 0)
            r->first_s = bl;
        else if (s != steps)
            r->later_s += bl, r->nlater++;
        r->ckpts++;
        (void)dflash_ckpt_prune(root, 1, s, g_err, sizeof g_err);
        printf("  %-5s step %3d: checkpoint, loop blocked %.2f s\n", r->mode, s, df_wall_s() - b0);
        fflush(stdout);
    }
    ckpt_result res;
    double b0 = df_wall_s();
    if (ckpt_writer_collect(&w, 1, NULL, NULL, &res) == 1) { /* the run ends when the last one is on disk */
        if (res.rc < 0)
            die_rc("async checkpoint", res.rc);
        r->write_s += res.write_s;
        r->final_wait_s = df_wall_s() - b0;
        r->blocked_s += r->final_wait_s;
    }
    r->wall_s = df_wall_s() - t0;
    ckpt_writer_free(&w);
}

int main(int argc, char **argv)
{
    const char *shape_name = "1.7b", *json = "bench/results/ckpt/async.json", *dir = NULL;
    int steps = 32, every = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_ckpt_async [--shape tiny|1.7b|8b] [--steps N] [--every K] [--dir D] [--json F]\n"
                   "  the training loop with no checkpoint (ceiling), with checkpoints written in the loop\n"
                   "  (sync) and on the writer thread (async); defaults --shape 1.7b --steps 32 --every 8,\n"
                   "  --dir a fresh directory under /tmp, --json bench/results/ckpt/async.json\n");
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--shape"))
            shape_name = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--steps"))
            steps = (int)df_arg_int("bench_ckpt_async", "--steps", argv[++i], 1, INT_MAX);
        else if (i + 1 < argc && !strcmp(argv[i], "--every"))
            every = (int)df_arg_int("bench_ckpt_async", "--every", argv[++i], 1, INT_MAX);
        else if (i + 1 < argc && !strcmp(argv[i], "--dir"))
            dir = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--json"))
            json = argv[++i];
        else {
            fprintf(stderr, "bench_ckpt_async: unknown argument %s (--help)\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || every < 1) {
        fprintf(stderr, "bench_ckpt_async: --steps and --every must be >= 1\n");
        return 2;
    }
    dflash_config c;
    shape(&c, shape_name);
    char tmpl[] = "/tmp/bench_ckpt_async.XXXXXX", root[600];
    if (!dir && !(dir = mkdtemp(tmpl))) {
        perror("bench_ckpt_async: mkdtemp");
        return 1;
    }
    dflash_params p;
    if (dflash_params_alloc(&p, &c) < 0) {
        fprintf(stderr, "bench_ckpt_async: no memory for %zu parameters\n", dflash_config_param_count(&c));
        return 1;
    }
    dflash_params_init_random(&p, &c, 3, 0.02f);
    adamw opt;
    adamw_config oc;
    adamw_config_default(&oc, steps);
    int rc = adamw_init(&opt, &oc, p.n);
    float *g = malloc(p.n * sizeof(float));
    if (rc < 0 || !g) {
        fprintf(stderr, "bench_ckpt_async: no memory for the optimizer state\n");
        return 1;
    }
    df_rng gr;
    df_rng_seed(&gr, 5);
    df_rng_fill_normal(&gr, g, p.n, 1e-3, 0);
    double gb = (double)p.n * 4 * 3 / 1e9;
    bench_env env;
    bench_env_read(&env);
    printf("bench_ckpt_async: %s drafter, %zu parameters, %.2f GB a checkpoint (weights + m + v), %d steps, a "
           "checkpoint every %d and at the end, under %s (%ld cpus)\n",
           shape_name, p.n, gb, steps, every, dir, env.cpus);
    run runs[3] = {{.mode = "none"}, {.mode = "sync"}, {.mode = "async"}};
    for (int i = 0; i < 3; i++) {
        snprintf(root, sizeof root, "%s/%s", dir, runs[i].mode);
        one_run(&runs[i], &c, &p, &opt, g, steps, every, root);
    }
    /* the resume side: dflash_manifest_verify of the async run's last checkpoint (every piece
     * of every file on every core) beside hashing the files one after the other (the first
     * verify) and beside the largest file alone (the most a thread a file, the version 1
     * manifest's verify, could reach) */
    char vdir[700], fp[800];
    snprintf(vdir, sizeof vdir, "%s/async/step-%08d", dir, steps);
    const char *vfiles[] = {"model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    double vseq = 0, vmax = 0, vpar = 1e30;
    for (int rep = 0; rep < 2; rep++) { /* the second pass of each, after the first warmed the cache */
        double sum = 0, mx = 0;
        for (int i = 0; i < 3; i++) {
            char hex[65];
            uint64_t sz;
            snprintf(fp, sizeof fp, "%s/%s", vdir, vfiles[i]);
            double t0 = df_wall_s();
            if ((rc = df_sha256_file(fp, hex, &sz)) < 0) {
                snprintf(g_err, sizeof g_err, "%s", fp);
                die_rc("df_sha256_file", rc);
            }
            double dt = df_wall_s() - t0;
            sum += dt, mx = dt > mx ? dt : mx;
        }
        vseq = sum, vmax = mx;
        long vstep;
        double t0 = df_wall_s();
        if ((rc = dflash_manifest_verify(vdir, &vstep, NULL, g_err, sizeof g_err)) < 0)
            die_rc("dflash_manifest_verify", rc);
        double dt = df_wall_s() - t0;
        vpar = dt < vpar ? dt : vpar;
    }
    double ceil_s = runs[0].wall_s;
    printf("\n%-24s %7s %8s %10s %13s %13s %11s %11s\n", "loop", "wall s", "steps/s", "of ceiling", "first ckpt",
           "later ckpts", "final wait", "write/ckpt");
    const char *label[3] = {"no checkpoint (ceiling)", "sync (before; peer)", "async (writer thread)"};
    for (int i = 0; i < 3; i++) {
        run *r = &runs[i];
        printf("%-24s %7.2f %8.3f %9.1f%% %12.2fs %12.2fs %10.2fs %10.2fs\n", label[i], r->wall_s, steps / r->wall_s,
               100.0 * ceil_s / r->wall_s, r->first_s, r->nlater ? r->later_s / r->nlater : 0.0, r->final_wait_s,
               r->ckpts ? r->write_s / r->ckpts : 0.0);
    }
    printf("(what the loop spent outside its steps for a checkpoint: the first one, the mean of the later ones before\n"
           " the end; sync: the whole write; async: the snapshot copy, whose first also faults its buffers in, plus\n"
           " waiting for a write still in flight; final wait: the end of the run waiting for the last write)\n");
    printf("\nverify of a %.2f GB checkpoint (resume, validator; files in the page cache, second pass):\n"
           "  one file after the other: %.2f s   largest file alone (the floor of a thread a file): %.2f s   "
           "dflash_manifest_verify, pieces on %d threads: %.2f s\n",
           gb, vseq, vmax, par_threads(), vpar);
    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "bench_ckpt_async: %s: %s\n", json, strerror(errno));
        return 1;
    }
    fprintf(f,
            "{\"bench\": \"ckpt_async\", \"commit\": \"%s\", \"host\": \"%s\", \"date\": \"%s\", \"cpus\": %ld,\n"
            " \"shape\": \"%s\", \"params\": %zu, \"ckpt_gb\": %.3f, \"steps\": %d, \"every\": %d, \"runs\": [\n",
            env.commit, env.host, env.date, env.cpus, shape_name, p.n, gb, steps, every);
    for (int i = 0; i < 3; i++) {
        run *r = &runs[i];
        fprintf(f,
                "  {\"mode\": \"%s\", \"wall_s\": %.3f, \"of_ceiling\": %.4f, \"checkpoints\": %d, "
                "\"blocked_first_s\": %.3f, \"blocked_later_s\": %.3f, "
                "\"blocked_s_per_ckpt\": %.3f, \"snapshot_s_per_ckpt\": %.3f, \"wait_prev_s_per_ckpt\": %.3f, "
                "\"final_wait_s\": %.3f, \"write_s_per_ckpt\": %.3f}%s\n",
                r->mode, r->wall_s, ceil_s / r->wall_s, r->ckpts, r->first_s, r->nlater ? r->later_s / r->nlater : 0.0,
                r->ckpts ? r->blocked_s / r->ckpts : 0.0, r->ckpts ? r->snap_s / r->ckpts : 0.0,
                r->ckpts ? r->waitprev_s / r->ckpts : 0.0, r->final_wait_s, r->ckpts ? r->write_s / r->ckpts : 0.0,
                i < 2 ? "," : "");
    }
    fprintf(f,
            "],\n \"verify\": {\"sequential_s\": %.3f, \"pieces_s\": %.3f, \"threads\": %d, \"largest_file_s\": "
            "%.3f}}\n",
            vseq, vpar, par_threads(), vmax);
    fclose(f);
    printf("wrote %s\n", json);
    char cmd[700];
    if (!strncmp(dir, "/tmp/bench_ckpt_async.", 22)) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_ckpt_async: could not remove %s\n", dir);
    }
    free(g);
    adamw_free(&opt);
    dflash_params_free(&p);
    return 0;
}
