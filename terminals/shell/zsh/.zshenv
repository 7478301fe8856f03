# Tether's shell integration for zsh (docs/commands.md). The worker starts zsh with ZDOTDIR here: each of
# these files reads the user's own one (from their ZDOTDIR, or HOME) with ZDOTDIR as they have it, so
# their setup runs as always; .zshrc then adds Tether's hooks, and ZDOTDIR is theirs again after the
# last startup file.
__tether_nonce=${TETHER_MARKS-}
__tether_zdotdir=${TETHER_ZDOTDIR:-$HOME}
__tether_had=${TETHER_ZDOTDIR:+1}  # the user had a ZDOTDIR of their own (else zsh used HOME)
__tether_here=$ZDOTDIR
unset TETHER_MARKS TETHER_ZDOTDIR
__tether_source() {
    [[ -r $__tether_zdotdir/$1 ]] || return 0
    ZDOTDIR=$__tether_zdotdir
    source "$ZDOTDIR/$1"
    __tether_zdotdir=$ZDOTDIR  # the user's file may move it (a .zshenv that sets ZDOTDIR)
    ZDOTDIR=$__tether_here
}
__tether_source .zshenv
# After the last startup file: ZDOTDIR as the user has it (unset where zsh used HOME).
__tether_restore() {
    if [[ -n $__tether_had || $__tether_zdotdir != $HOME ]]; then
        ZDOTDIR=$__tether_zdotdir
    else
        unset ZDOTDIR
    fi
    unset __tether_here __tether_had
    unfunction __tether_source __tether_restore
}
