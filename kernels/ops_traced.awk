# kernels/ops.def, expanded by the preprocessor to one "@KERNEL_OP ret|name|(params)" line per op,
# into kernels/traced.c's list: KERNEL_OP_TRACED(ret, name, (params), (args)), or
# KERNEL_OP_TRACED_VOID(name, (params), (args)), args being each parameter's name (the last
# identifier of each declaration: ops.def's parameters are plain, no function pointers).
/^@KERNEL_OP / {
    sub(/^@KERNEL_OP /, "")
    split($0, part, "|")
    ret = part[1]; name = part[2]; params = part[3]
    gsub(/^[ \t]+|[ \t]+$/, "", ret)
    gsub(/^[ \t]+|[ \t]+$/, "", name)
    inner = params
    sub(/^[ \t]*\(/, "", inner)
    sub(/\)[ \t]*$/, "", inner)
    args = ""
    if (inner !~ /^[ \t]*void[ \t]*$/) {
        n = split(inner, decl, ",")
        for (i = 1; i <= n; i++) {
            if (!match(decl[i], /[A-Za-z_][A-Za-z0-9_]*[ \t]*$/)) {
                print "ops_traced.awk: no parameter name in '" decl[i] "' of " name > "/dev/stderr"
                exit 1
            }
            arg = substr(decl[i], RSTART, RLENGTH)
            gsub(/[ \t]+$/, "", arg)
            args = args (i > 1 ? ", " : "") arg
        }
    }
    if (ret == "void") printf "KERNEL_OP_TRACED_VOID(%s, %s, (%s))\n", name, params, args
    else printf "KERNEL_OP_TRACED(%s, %s, %s, (%s))\n", ret, name, params, args
}
