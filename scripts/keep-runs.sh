#!/usr/bin/env bash
# Keeps a suite's finished runs in git, so that `phasekv repro` resumes them on another machine:
# runs/ is not committed, and the machine a session works on can change between sessions.
#
#   bash scripts/keep-runs.sh save RUNS [KEEP]     every run of RUNS with a run.done (all its
#                                                  steps finished, src/suite/runner.h) that KEEP
#                                                  lacks becomes KEEP/NAME.tar.xz: the run
#                                                  directory without model/checkpoint (the
#                                                  optimiser state of a finished training)
#                                                  and the suite's suite.json beside them
#   bash scripts/keep-runs.sh restore RUNS [KEEP]  unpacks every KEEP/NAME.tar.xz whose run RUNS
#                                                  lacks (no RUNS/NAME/run.done), and suite.json
#                                                  when RUNS has none; then `phasekv repro --out
#                                                  RUNS` skips those runs, and `phasekv repro
#                                                  report RUNS` pages what is there
#
# KEEP defaults to results/ followed by RUNS without its leading runs/ (runs/repro/study ->
# results/repro/study). A kept run is never rewritten: each archive is committed once. Which CPU
# trained a run is in its run.done and model/train.json; `repro report` names it.
set -euo pipefail

usage() {
  echo "usage: bash scripts/keep-runs.sh save|restore RUNS_DIR [KEEP_DIR]" >&2
  exit 2
}
[ $# -ge 2 ] && [ $# -le 3 ] || usage
action=$1
runs=${2%/}
keep=${3:-results/${runs#runs/}}
keep=${keep%/}

case "$action" in
  save)
    [ -d "$runs" ] || { echo "keep-runs: $runs is not a directory (give the --out of phasekv repro)" >&2; exit 1; }
    mkdir -p "$keep"
    saved=0
    for done in "$runs"/*/run.done; do
      [ -e "$done" ] || continue
      dir=$(dirname "$done")
      name=$(basename "$dir")
      [ -e "$keep/$name.tar.xz" ] && continue
      # Fixed owner, order and times: the same run archives to the same bytes.
      tar -C "$dir" --exclude=./model/checkpoint --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime=@0 -cf - . | xz -9 -T1 >"$keep/$name.tar.xz.tmp"
      mv "$keep/$name.tar.xz.tmp" "$keep/$name.tar.xz"
      echo "keep-runs: kept $name ($(du -k "$keep/$name.tar.xz" | cut -f1) KiB)"
      saved=$((saved + 1))
    done
    # The parsed suite (the runner rewrites it on every start): what `repro report` reads.
    [ -e "$runs/suite.json" ] && cp "$runs/suite.json" "$keep/suite.json"
    echo "keep-runs: $saved new run(s) in $keep"
    ;;
  restore)
    [ -d "$keep" ] || { echo "keep-runs: $keep is not a directory (nothing kept)" >&2; exit 1; }
    mkdir -p "$runs"
    restored=0
    for archive in "$keep"/*.tar.xz; do
      [ -e "$archive" ] || continue
      name=$(basename "$archive" .tar.xz)
      [ -e "$runs/$name/run.done" ] && continue
      rm -rf "$runs/$name.restoring"
      mkdir -p "$runs/$name.restoring"
      tar -C "$runs/$name.restoring" -xJf "$archive"
      rm -rf "${runs:?}/$name"
      mv "$runs/$name.restoring" "$runs/$name"
      restored=$((restored + 1))
    done
    [ -e "$keep/suite.json" ] && [ ! -e "$runs/suite.json" ] && cp "$keep/suite.json" "$runs/suite.json"
    echo "keep-runs: $restored run(s) restored into $runs"
    ;;
  *) usage ;;
esac
