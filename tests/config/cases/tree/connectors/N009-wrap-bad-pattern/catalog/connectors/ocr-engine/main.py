# A case tree's connector: the checks read that its code is here; nothing runs it.
