__tether_source .zshrc
[[ -o login ]] || __tether_restore
if [[ -n $__tether_nonce && -o interactive ]]; then
    zmodload zsh/datetime 2>/dev/null
    # First among the precmd hooks, so $? is still the last command's; given back for the others.
    typeset -gi __tether_prompt=0
    __tether_precmd() {
        local last=$?
        (( __tether_prompt++ ))
        builtin printf '\e]133;D;%s;p=%s;at=%s;tether=%s\a\e]133;A;tether=%s\a' \
            $last $__tether_prompt "${EPOCHREALTIME-}" $__tether_nonce $__tether_nonce
        return $last
    }
    # $1 is the line as typed (zsh hands it to preexec hooks; $3 when history is off). A line kept out of
    # history on purpose (hist_ignore_space) is kept out of the record too: fresh=0 and no line.
    __tether_preexec() {
        local line=${${1:-$3}[1,2000]} fresh=1
        if [[ -o hist_ignore_space && $line == ' '* ]]; then
            line= fresh=0
        fi
        line=${line//\\/\\\\}
        line=${line//;/\\x3b}
        line=${line//$'\n'/\\x0a}
        line=${line//$'\t'/\\x09}
        line=${line//$'\r'/\\x0d}
        line=${line//$'\e'/\\x1b}
        line=${line//$'\a'/\\x07}
        if [[ $line == *[[:cntrl:]]* ]]; then  # every other control character too, as bash's does
            local out= ch i
            for (( i = 1; i <= ${#line}; i++ )); do
                ch=${line[i]}
                [[ $ch == [[:cntrl:]] ]] && ch=$(builtin printf '\\x%02x' "'$ch")
                out+=$ch
            done
            line=$out
        fi
        builtin printf '\e]133;C;fresh=%s;p=%s;at=%s;cmdline=%s;tether=%s\a' $fresh $__tether_prompt \
            "${EPOCHREALTIME-}" "$line" $__tether_nonce
    }
    typeset -ga precmd_functions preexec_functions  # declared (kept) for a shell under nounset
    precmd_functions=(__tether_precmd "${precmd_functions[@]}")
    preexec_functions=(__tether_preexec "${preexec_functions[@]}")
else
    unset __tether_nonce
fi
