#!/bin/bash
# Lever: a privileged critic trained with noise on its privileged input, on seed S's iteration-1 store (the
# privileged arm's, the same as the critic arm's at iteration 1), judged on the critic arm's policy-1 states.
# bash noise.sh <seed> <noise>
cd $HOME/study_code
export PYTHONPATH=$HOME/study_code MUJOCO_GL=egl OMP_NUM_THREADS=1
S=$HOME/recap_study/s$1; OUT=$HOME/recap_study/lever/s$1_noise$2
PY=/work/main/.venv/bin/python
$PY -m capsule_rollout train_critic --data $S/privileged/episodes.zarr --out $OUT --steps 1500 --batch_size 128 \
  --eval_every 1500 --seed 0 --max_steps 80 --privileged --privileged_noise $2 --no-progress --json $OUT.train.json
[ -f $OUT.ceiling.json ] || $PY -m capsule_rollout value_ceiling --model.policy $S/critic/policy_1 --model.critic $OUT \
  --seeds.count 200 --branches 8 --slots 4 --json $OUT.ceiling.json
