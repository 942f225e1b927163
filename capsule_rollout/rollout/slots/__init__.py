"""Slots: N envs on one host, the policy and critic batched over them (`host.SlotHost`), the items they play side
by side (`work`), the batched calls to the models (`calls`), and the check that a policy plays the same episode at
any slot count (`check`)."""
