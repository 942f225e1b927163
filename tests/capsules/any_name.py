"""A state reader's namespace for tests of the reader itself: it resolves any name already loaded (the reader's own
bounds, and what a trust level allows, are tested elsewhere)."""

from capsule_rollout.capsules import state_codec as sc


class AnyLoadedName:
    def lookup(self, module, qualname, purpose):
        found = sc.loaded(module, qualname)
        if found is None:
            raise sc.StateNameError(f"{module}:{qualname}")
        return found
