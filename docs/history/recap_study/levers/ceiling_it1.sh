#!/bin/bash
# The critics of iteration 1 (critic arm, privileged arm: trained on the same store) on the same states:
# value_ceiling of the critic arm's policy 1, once with each critic. bash ceiling_it1.sh <seed>
cd $HOME/study_code
export PYTHONPATH=$HOME/study_code MUJOCO_GL=egl OMP_NUM_THREADS=1
S=$HOME/recap_study/s$1
for C in critic privileged; do
  [ -f $S/ceiling_it1_$C.json ] && continue
  /work/main/.venv/bin/python -m capsule_rollout value_ceiling --model.policy $S/critic/policy_1 \
    --model.critic $S/$C/critic_1 --seeds.count 200 --branches 8 --slots 4 --json $S/ceiling_it1_$C.json.tmp \
    && mv $S/ceiling_it1_$C.json.tmp $S/ceiling_it1_$C.json
done
