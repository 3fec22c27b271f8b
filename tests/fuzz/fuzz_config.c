// libFuzzer target: the config parser and the command line over it, as `titan --config FILE
// --section.key value ...` reads them. The input is YAML text, then optionally FUZZ_ARGS_START
// and whitespace-separated arguments that follow `--config FILE` on the command line (any
// naming another config file are dropped: the target reads only its own). An accepted config
// must print (as --print-config does) as text that parses back to the same config; a refusal,
// of the parse or of the checks that follow it, must be one line.
#include <string.h>

#include "core/config.h"
#include "tests/fuzz/fuzz_file.h"

#define FUZZ_ARGS_START "#args"
#define MAX_ARGS 16

// Splits text[0, len) at whitespace into argv[first, ...), copies in buf; returns the new argc.
static int args_split(const uint8_t *text, size_t len, char *buf, char **argv, int first) {
    int argc = first;
    memcpy(buf, text, len);
    buf[len] = '\0';
    for (char *tok = strtok(buf, " \t\r\n"); tok && argc < MAX_ARGS; tok = strtok(NULL, " \t\r\n"))
        if (strncmp(tok, "--config", 8) != 0 && strncmp(tok, "--job.config_file", 17) != 0)
            argv[argc++] = tok;
    return argc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], err[1024] = "";
    size_t head;
    const uint8_t *args = fuzz_split(data, size, FUZZ_ARGS_START, &head);
    fuzz_file_write("config.yaml", data, head, path, sizeof path);
    char *argv[MAX_ARGS] = {"titan", "--config", path};
    char *buf = malloc(args ? size - (size_t)(args - data) + 1 : 1);
    int argc = args ? args_split(args, size - (size_t)(args - data), buf, argv, 3) : 3;
    Config c;
    config_defaults(&c);
    if (!config_parse_args(&c, argc, argv, err, sizeof err)) {
        fuzz_refusal_check(err);
    } else if (!config_roundtrip_check(&c, err, sizeof err)) {
        fprintf(stderr, "fuzz: %s\n", err);
        abort();
    } else if (!config_check_supported(&c, err, sizeof err)) {
        fuzz_refusal_check(err);
    }
    config_free(&c);
    free(buf);
    return 0;
}
