# Sanitizer options for `make sanitize` (sourced by tests/sanitize/run.sh): the first report
# of any kind ends the process with an error, leaks included; leak reports from the
# third-party libraries listed in lsan.supp are ignored. OpenMPI keeps its plugins loaded so
# that their frames have names; the processes that start MPI unwind leak stacks fully
# (MPI_UNWIND: OpenMPI lacks frame pointers, and a suppression must see its frames), which
# makes every malloc several times slower, so the others keep the fast unwinder.
# intercept_tls_get_addr=0: gcc 12's LeakSanitizer crashes ("Tracer caught signal 11") on the
# dynamic TLS of the plugins OpenMPI loads; without that tracking, what only a plugin's TLS
# holds is OpenMPI's, which lsan.supp ignores anyway.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:exitcode=86:detect_stack_use_after_return=1:check_initialization_order=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86
export LSAN_OPTIONS=suppressions=$here/lsan.supp:print_suppressions=0:exitcode=86
export OMPI_MCA_mca_base_component_disable_dlclose=1
MPI_UNWIND=ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0
unset here
