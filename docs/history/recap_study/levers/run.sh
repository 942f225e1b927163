#!/bin/bash
# The RECAP study, resumable: bash run.sh "<seeds>" "<arms>" [--option value ...]
# Runs from a snapshot of the code (~/study_code: `git archive HEAD | tar -x -C ~/study_code`), so the work tree can
# change while it runs; one torch thread (two study processes share this machine's 2 cores).
cd $HOME/study_code
export PYTHONPATH=$HOME/study_code MUJOCO_GL=egl OMP_NUM_THREADS=1
exec /work/main/.venv/bin/python -m capsule_rollout recap_study --root $HOME/recap_study \
  --history $HOME/recap_study/history --seeds $1 --arms $2 --recap.progress False "${@:3}"
