/* exit_codes.h: the one list of exit codes (common/util.h DF_EXIT_*) as people read it.
 *
 * `orchestrator --help` and `dfctl --help` print DF_EXIT_CODES_TEXT; README.md ("Exit codes")
 * and docs/operations.md ("Exit codes") hold the same lines, and tests/test_exit_codes.sh
 * keeps the four equal and checks the codes against DF_EXIT_* in common/util.h.
 */
#ifndef DF_EXIT_CODES_H
#define DF_EXIT_CODES_H

#define DF_EXIT_CODES_TEXT                                                                        \
    "exit codes (the same for every program):\n"                                                  \
    "  0    done: the run is complete, or a requested stop (dfctl shutdown, Ctrl-C, SIGTERM)\n"   \
    "       drained cleanly (orchestrator --resume continues it); dfctl: the request was done\n"  \
    "  1    failed, worth another try: the run failed (restart limit, a permanent failure that\n" \
    "       no peer could take over, forced kills, its record could not be written); dfctl:\n"    \
    "       cannot connect (it says how a finished run ended) or the request was refused;\n"      \
    "       a worker: temporary failure, the orchestrator restarts it\n"                          \
    "  2    bad usage or input, nothing started: command line, topology, data, a run dir in\n"    \
    "       use, a --resume that does not verify; dfctl: unknown command or worker\n"             \
    "  100  permanent failure, never retried: bad model, data or config (workers and tools;\n"    \
    "       never the orchestrator or dfctl)\n"

#endif
