# Tether's shell integration for POSIX shells: busybox ash, dash (docs/commands.md). Read by the shell as
# its ENV file, after /etc/profile and ~/.profile for a login shell; it reads the user's own ENV file
# first, if there was one. Such shells mark no command's start: at each prompt it marks how the last
# command ended ($?) with the line history holds for it, the prompt's start and its end, each with this
# shell's nonce. PS1 shows what it showed before (the marks are invisible).
__tether_nonce=${TETHER_MARKS-}
unset TETHER_MARKS
if [ -n "${TETHER_ENV_WAS-}" ]; then
    ENV=$TETHER_ENV_WAS
    unset TETHER_ENV_WAS
    [ -r "$ENV" ] && . "$ENV"
else
    unset ENV
fi
case $- in
*i*) ;;
*) __tether_nonce= ;;
esac
if [ -n "$__tether_nonce" ]; then
    # $1: the last command's status. Printed from PS1, in a subshell: the history's last line (busybox
    # ash keeps one; dash does not) with its number, hex-encoded, then the prompt's start.
    __tether_a() {
        __tether_h=$(history 2>/dev/null | tail -n 1)
        __tether_h=${__tether_h#"${__tether_h%%[! ]*}"}
        __tether_n=${__tether_h%% *}
        case $__tether_n in
        '' | *[!0-9]*) __tether_n= __tether_h= ;;
        *) __tether_h=${__tether_h#* } ;;
        esac
        printf '\033]133;D;%s;hist=%s;cmdhex=%s;tether=%s\007\033]133;A;tether=%s\007' "$1" "$__tether_n" \
            "$(printf '%s' "$__tether_h" | head -c 2000 | od -An -tx1 | tr -d ' \n')" \
            "$__tether_nonce" "$__tether_nonce"
    }
    __tether_b() {
        printf '\033]133;B;tether=%s\007' "$__tether_nonce"
    }
    # busybox ash counts every character of the prompt as taking a column unless it is between \[ and \]
    # (its "fancy prompt"): without them it wrapped a typed line early for any client that does not
    # answer its cursor query (ESC [6n) with where the prompt really ended. dash knows no \[ and would
    # print it, and takes the marks as they are.
    case $(readlink "/proc/$$/exe" 2>/dev/null) in
    *busybox*) PS1='\[$(__tether_a $?)\]'"${PS1-\$ }"'\[$(__tether_b)\]' ;;
    *) PS1='$(__tether_a $?)'"${PS1-\$ }"'$(__tether_b)' ;;
    esac
else
    unset __tether_nonce
fi
