// `titan generate`: a prompt's continuation from a trained model (usage in generate.c).
#pragma once

// argv[0] is "generate"; returns the exit status (user errors exit 2 through die_user).
int generate_main(int argc, char **argv);
