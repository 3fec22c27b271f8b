#include "core/thread_exit.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/errors.h"

// What one thread registered, newest first: the value of its key, which pthreads hands to
// owned_free when the thread exits.
typedef struct Owned {
    void *ptr;
    void (*free_fn)(void *);
    struct Owned *next;
} Owned;

static pthread_key_t owned_key;
static pthread_once_t owned_once = PTHREAD_ONCE_INIT;

static void owned_free(void *head) {
    for (Owned *o = head, *next; o; o = next) {
        next = o->next;
        o->free_fn(o->ptr);
        free(o);
    }
}

static void owned_key_create(void) { CHECK(pthread_key_create(&owned_key, owned_free) == 0); }

void thread_exit_free(void *ptr, void (*free_fn)(void *)) {
    CHECK(pthread_once(&owned_once, owned_key_create) == 0);
    Owned *o = xmalloc(sizeof *o);
    *o = (Owned){.ptr = ptr, .free_fn = free_fn, .next = pthread_getspecific(owned_key)};
    CHECK(pthread_setspecific(owned_key, o) == 0);
}
