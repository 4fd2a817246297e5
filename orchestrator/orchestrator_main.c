/* orchestrator_main.c: `orchestrator <topology.json>`, or
 * `orchestrator --resume <run dir | topology.json> [--topology FILE] [--accept-changes]`.
 *
 * Validates the topology (exit 2 with the JSON path of the error, nothing started), prepares
 * the run (setup.c), starts the control socket, the metrics and every worker, and runs the
 * libuv loop until the run ends. Exit codes (exit_codes.h, the list --help prints): 0 the run
 * is complete, or a requested shutdown drained cleanly; 1 the run failed (a worker hit its
 * restart limit or failed permanently with nobody to take over, a shutdown had to SIGKILL,
 * the workers ended with batches left, or the final audit / ledger.bin could not be
 * written); 2 bad command line, topology or data, a run dir in use by another orchestrator,
 * or a --resume whose ledger.bin, plan or data files do not verify, whose run dir contradicts
 * itself (checkpoints without ledger.bin) or whose topology differs from the run's record in
 * a way not accepted (nothing started); never 100. docs/operations.md.
 */
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "exit_codes.h"
#include "orch.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: orchestrator <topology.json>\n"
               "       orchestrator --resume <run dir | topology.json> [--topology FILE] [--accept-changes]\n"
               "\n"
               "Starts a dflash-pipe run: validates the topology, creates the run dir (0700) with\n"
               "topology.json, logs/, metrics/ and the control socket ctl.sock, creates the shared\n"
               "segments and arenas, spawns and supervises every worker until the epoch is done.\n"
               "\n"
               "  --resume   continue the run in <run dir> (or the run_dir of <topology.json>) from its\n"
               "             last committed checkpoint (ledger.bin); uncommitted batches are redone. It runs\n"
               "             with the topology given (<topology.json> or --topology FILE), else the run dir's\n"
               "             topology.json; any difference from what the run was started with is listed\n"
               "             (field: old -> new) and refused unless accepted\n"
               "  --topology FILE   with --resume <run dir>: the topology to resume with\n"
               "  --accept-changes  with --resume: apply the differences listed, if every one of them may\n"
               "             change on resume (cadences, limits, timeouts, worker counts; before anything\n"
               "             is committed, any field); the run's record is updated (docs/operations.md)\n"
               "  -h, --help this text\n"
               "\n"
               "Control it with dfctl (dfctl --help). SIGINT/SIGTERM: drain and stop (twice: faster).\n"
               "\n" DF_EXIT_CODES_TEXT);
}

int main(int argc, char **argv)
{
    int resume = 0, accept = 0;
    const char *path = NULL, *topology = NULL;
    df_log_init("orchestrator");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--resume")) {
            resume = 1;
        } else if (!strcmp(argv[i], "--accept-changes")) {
            accept = 1;
        } else if (!strcmp(argv[i], "--topology")) {
            if (i + 1 >= argc || topology) {
                df_log("--topology needs one FILE");
                return DF_EXIT_USAGE;
            }
            topology = argv[++i];
        } else if (argv[i][0] == '-') {
            df_log("unknown option %s", argv[i]);
            usage(stderr);
            return DF_EXIT_USAGE;
        } else if (!path) {
            path = argv[i];
        } else {
            df_log("more than one topology/run dir given (%s, %s)", path, argv[i]);
            return DF_EXIT_USAGE;
        }
    }
    if (!path) {
        usage(stderr);
        return DF_EXIT_USAGE;
    }
    if (!resume && (accept || topology)) {
        df_log("%s goes with --resume (a new run takes its topology file as the argument)",
               accept ? "--accept-changes" : "--topology");
        return DF_EXIT_USAGE;
    }
    signal(SIGPIPE, SIG_IGN);

    static orch o; /* large: keep it off the stack */
    memset(&o, 0, sizeof o);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        df_log("/proc/self/exe: %s", strerror(errno));
        return DF_EXIT_TEMP;
    }
    self[n] = 0;
    snprintf(o.self_dir, sizeof o.self_dir, "%s", dirname(self));
    o.resume_topology = topology;
    o.accept_changes = accept;

    char err[1024] = "";
    char note[1300];
    int rc = setup_run(&o, path, resume, err, sizeof err);
    if (rc < 0) {
        setup_remove_new_run_dir(&o, note, sizeof note);
        df_log("%s%s", err[0] ? err : strerror(-rc), note);
        setup_teardown(&o);
        return DF_EXIT_USAGE;
    }
    if (resume && setup_run_complete(&o)) {
        /* --resume of a finished run: starting the workers would only have them find nothing
         * to do; write what the end of the run should have written and is missing (a full
         * disk or a crash at the very end), and leave the rest as it is */
        char done[2600];
        if ((rc = setup_write_missing(&o, done, sizeof done, err, sizeof err)) < 0) {
            df_log("run %s is complete but its final audit cannot be written: %s; free space "
                   "and run `orchestrator --resume %s` again",
                   o.t.name, err, o.run_dir);
            setup_teardown(&o);
            return DF_EXIT_TEMP;
        }
        char stamp[40];
        df_log_stamp(stamp, sizeof stamp);
        if (done[0])
            printf("%s orchestrator: run %s is complete: every batch of epoch %u committed (step %llu); wrote the "
                   "missing %s\n",
                   stamp, o.t.name, ledger_epoch(&o.led) + 1 /* from 1, as every message */,
                   (unsigned long long)ledger_committed_step(&o.led), done);
        else
            printf("%s orchestrator: run %s is already complete: every batch of epoch %u committed (step %llu), "
                   "release export in %s/drafter; nothing to do\n",
                   stamp, o.t.name, ledger_epoch(&o.led) + 1, (unsigned long long)ledger_committed_step(&o.led),
                   o.run_dir);
        setup_teardown(&o);
        return DF_EXIT_OK;
    }
    o.loop = uv_default_loop();
    if ((rc = control_start(&o, err, sizeof err)) < 0) {
        control_stop(&o);
        setup_remove_new_run_dir(&o, note, sizeof note);
        df_log("control socket: %s%s", err, note);
        setup_teardown(&o);
        return DF_EXIT_TEMP;
    }
    if ((rc = report_start(&o)) < 0) {
        control_stop(&o);
        setup_remove_new_run_dir(&o, note, sizeof note);
        df_log("%s/metrics/orchestrator.jsonl: %s%s", o.run_dir, strerror(-rc), note);
        setup_teardown(&o);
        return DF_EXIT_TEMP;
    }
    df_log("run %s: %d workers, %d rings, run dir %s%s", o.t.name, o.t.n_workers, o.t.n_rings, o.run_dir,
           resume ? " (resumed)" : "");
    orch_event(&o, json_pack("{s:s, s:s, s:i, s:i}", "ev", "start", "run_dir", o.run_dir, "resume", resume, "pid",
                             (int)getpid()));
    supervisor_start(&o);
    uv_run(o.loop, UV_RUN_DEFAULT);
    int code = o.exit_code;
    (void)uv_loop_close(o.loop);
    if (o.events_fd >= 0)
        close(o.events_fd);
    setup_teardown(&o);
    return code;
}
