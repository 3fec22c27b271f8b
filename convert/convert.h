// `titan convert`: titan checkpoints to Hugging Face's format and back (usage in convert.c).
#pragma once

// argv[0] is "convert"; returns the exit status (user errors exit 2 through die_user).
int convert_main(int argc, char **argv);
