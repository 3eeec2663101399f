"""Bank accounts in integer cents."""


class InsufficientFunds(Exception):
    """A withdrawal larger than the balance plus the overdraft."""


class Account:
    """An account with an optional overdraft limit (all amounts in cents)."""

    def __init__(self, owner, balance=0, overdraft=0):
        if balance < 0 or overdraft < 0:
            raise ValueError("balance and overdraft must be non-negative")
        self.owner = owner
        self.balance = balance
        self.overdraft = overdraft
        self.history = []

    def deposit(self, amount):
        """Add ``amount`` (> 0); return the new balance."""
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))
        return self.balance

    def withdraw(self, amount):
        """Remove ``amount`` (> 0) if the balance plus overdraft allows it."""
        if amount <= 0:
            raise ValueError("withdrawal must be positive")
        if amount > self.balance + self.overdraft:
            raise InsufficientFunds(f"{self.owner} cannot withdraw {amount}")
        self.balance -= amount
        self.history.append(("withdraw", amount))
        return self.balance

    def available(self):
        """What may still be withdrawn."""
        return self.balance + self.overdraft


def transfer(source, target, amount):
    """Move ``amount`` between accounts; nothing changes if the withdrawal fails."""
    source.withdraw(amount)
    target.deposit(amount)
    return source.balance, target.balance


def total_balance(accounts):
    """Sum of balances."""
    return sum(account.balance for account in accounts)
