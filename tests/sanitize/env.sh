# Sanitizer options for `make sanitize` (sourced by tests/sanitize/run.sh): the first report
# of any kind ends the process with an error, leaks included; leak reports from the
# third-party libraries listed in lsan.supp are ignored. Leak stacks are unwound fully
# (fast_unwind_on_malloc=0), since the libraries lack frame pointers and a suppression must
# see their frames; OpenMPI keeps its plugins loaded so that their frames have names.
# intercept_tls_get_addr=0: gcc 12's LeakSanitizer crashes ("Tracer caught signal 11") on the
# dynamic TLS of the plugins OpenMPI loads; without that tracking, what only a plugin's TLS
# holds is OpenMPI's, which lsan.supp ignores anyway.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:exitcode=86:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:intercept_tls_get_addr=0:fast_unwind_on_malloc=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86
export LSAN_OPTIONS=suppressions=$here/lsan.supp:print_suppressions=0:exitcode=86
export OMPI_MCA_mca_base_component_disable_dlclose=1
unset here
