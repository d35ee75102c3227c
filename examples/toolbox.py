"""A toolbox: one class, its methods the tools, its attributes the state one run's calls share
(loaded with `--tools examples.toolbox`; used by `examples/shopping-agent.json`)."""

from __future__ import annotations

from stevora import Toolbox, toolbox


@toolbox
class ShoppingList(Toolbox):
    """Offered as `ShoppingList_add`, `ShoppingList_remove` and `ShoppingList_show`; a step lists
    them all with `"tools": ["ShoppingList"]`. Each run gets its own list."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, item: str, quantity: int = 1) -> list[str]:
        """Put an item on the list; returns the list.

        Args:
            item: What to buy, e.g. "oat milk".
            quantity: How many.
        """
        self.items.extend([item] * quantity)
        return self.items

    def remove(self, item: str) -> bool:
        """Take one of an item off the list; False when it was not on it."""
        if item not in self.items:
            return False
        self.items.remove(item)
        return True

    def show(self) -> list[str]:
        """Everything on the list, in the order it was added."""
        return self.items
