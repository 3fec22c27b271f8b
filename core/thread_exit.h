// Per-thread caches (a _Thread_local pointer made on a thread's first use) are freed when
// their thread exits: OpenMP and tokenizer worker threads come and go, and a cache left behind
// by each would leak.
#pragma once

// Frees ptr with free_fn when the calling thread exits (after any earlier registrations of
// that thread, in reverse order). The main thread's caches live until the process ends.
void thread_exit_free(void *ptr, void (*free_fn)(void *));
