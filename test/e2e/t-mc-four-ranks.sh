# t-mc-two-ranks.sh with four ranks on four fake devices (BindMem v1,
# BindAddr_v2 with unbind/rebind, BindMem_v2, BindAddr_v2).
MC_RANKS=4 . "$srcdir/t-mc-two-ranks.sh"
