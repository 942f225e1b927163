#!/bin/bash
# The RECAP study, resumable: bash ~/recap_study/run.sh "<seeds>" <log name>; code from ~/study_code
cd $HOME/study_code3
export PYTHONPATH=$HOME/study_code3 MUJOCO_GL=egl OMP_NUM_THREADS=1
exec /work/main/.venv/bin/python -m capsule_rollout recap_study --root $HOME/recap_study \
  --history $HOME/recap_study/history --seeds $1 --arms $2 --recap.progress False
