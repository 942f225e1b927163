#!/bin/bash
# Lever probe: the critic trained 3x longer (4,500 steps) on seed S's iteration-3 store (the critic arm's: 900
# episodes), everything else as recap's critic_3; judged on the states of the critic arm's ceiling (policy 3).
# bash critic_steps.sh <seed>
cd $HOME/study_code
export PYTHONPATH=$HOME/study_code MUJOCO_GL=egl OMP_NUM_THREADS=1
S=$HOME/recap_study/s$1; OUT=$HOME/recap_study/lever/s$1_critic3_steps4500
PY=/work/main/.venv/bin/python
$PY -m capsule_rollout train_critic --data $S/critic/episodes.zarr --out $OUT --steps 4500 --batch_size 128 \
  --eval_every 1500 --seed 0 --max_steps 80 --no-progress --json $OUT.train.json
[ -f $OUT.ceiling.json ] || $PY -m capsule_rollout value_ceiling --model.policy $S/critic/policy_3 --model.critic $OUT \
  --seeds.count 200 --branches 8 --slots 4 --json $OUT.ceiling.json
