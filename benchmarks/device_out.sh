# What a GPU call's $OUT holds when the device returns it, for the scripts that run there (sourced, not run).
# The device returns a limited number of files from $OUT (8 in the ninth session on issues 44-46): a compare's
# run directories once crowded out the curves' JSON and picture, and later the plan YAMLs did. So the run
# directories travel as one archive each (pack_runs DIR) and the plans, their explanations and the set-up logs
# as plans.tgz (pack_plans, on the calling script's exit when it sets `trap pack_plans EXIT`).
pack_runs() { [ -d "$1" ] && tar -czf "$OUT/$(basename "$1").tgz" -C "$(dirname "$1")" "$(basename "$1")"; }
pack_plans() { (cd "$OUT" && ls ./*.yaml ./*.err ./*_explain.txt ./*_env.log 2>/dev/null | xargs -r tar -czf plans.tgz --remove-files); }
