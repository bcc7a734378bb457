/* roam real-program suite: wasi-libc (Debian bookworm) has no <setjmp.h>
 * (setjmp/longjmp on wasm need the exception-handling proposal). Programs
 * that include it are built with their throw/catch macros defined to
 * abort-style ones on the command line (see workloads/real/build.sh), so an
 * empty header is enough. */
