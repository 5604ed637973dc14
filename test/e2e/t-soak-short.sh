# Five checkpoint/restore cycles of a four-process sharing job (soak.sh):
# every byte and address after each restore, and a write through a
# different rank each cycle seen by all four.
. "$srcdir/soak.sh" 5
note done
