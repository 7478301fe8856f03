# Tether's shell integration for bash (docs/commands.md). Run once, at the first prompt, by the
# PROMPT_COMMAND the owner worker starts bash with, after bash has read the user's own startup files
# exactly as it always does. It marks each prompt and each command with OSC 133 (the marks VS Code,
# iTerm2 and WezTerm read), each carrying this shell's nonce, so Tether can keep every command on the
# record. It changes nothing the user sees: the marks are invisible, PS1 is not touched.
__tether_nonce=${TETHER_MARKS-}
unset TETHER_MARKS TETHER_BASH
export -n PROMPT_COMMAND PS0 2>/dev/null
# The user's prompt commands, without the hook that ran this script (and the separators it leaves).
__tether_theirs() {
    local rest=${PROMPT_COMMAND//'eval "$TETHER_BASH"'/}
    rest=${rest//'__tether_precmd'/}
    rest=${rest//'__tether_hist=${HISTCMD-0}'/}
    while [[ $rest =~ ^[[:space:]\;]+ ]]; do rest=${rest:${#BASH_REMATCH[0]}}; done
    while [[ $rest =~ [[:space:]\;]+$ ]]; do rest=${rest:0:${#rest}-${#BASH_REMATCH[0]}}; done
    while [[ $rest =~ \;[[:space:]]*\; ]]; do rest=${rest/"${BASH_REMATCH[0]}"/;}; done
    printf '%s' "$rest"
}
if [[ -n $__tether_nonce && $- == *i* ]]; then
    __tether_hist=${HISTCMD-0}
    __tether_prompt=0

    # At every prompt, first: how the last command ended ($? is still its status; p: this prompt's
    # number, so the end is matched to the command typed at the prompt before), then the prompt. When
    # the user's setup put its own prompt commands before this one, $? is theirs: no status is said,
    # and the order is put right for the next prompt.
    __tether_precmd() {
        local status=$?
        ((__tether_prompt++))
        if [[ ${PROMPT_COMMAND%%;*} != __tether_precmd ]]; then
            __tether_order
            status=
        fi
        builtin printf '\e]133;D;%s;p=%s;at=%s;tether=%s\a\e]133;A;tether=%s\a' \
            "$status" "$__tether_prompt" "${EPOCHREALTIME-}" "$__tether_nonce" "$__tether_nonce"
        return ${status:-0}
    }
    # Ours first ($? is the last command's), theirs, then where history stands once theirs ran (a
    # `history -a; history -n` of theirs moves it).
    __tether_order() {
        local theirs
        theirs=$(__tether_theirs)
        PROMPT_COMMAND="__tether_precmd${theirs:+; $theirs}; __tether_hist=\${HISTCMD-0}"
    }

    # From PS0 (in a subshell, after the line is read, before it runs): the command line as history
    # has it. fresh=0 when history did not take the line (a repeat, or one kept out of it).
    __tether_preexec() {
        local LC_ALL=C line fresh=0
        ((${HISTCMD-0} > __tether_hist)) && fresh=1
        line=$(builtin fc -l -0 2>/dev/null)
        line=${line#*$'\t'}
        line=${line# }
        line=${line:0:2000}
        line=${line//\\/\\\\}
        line=${line//;/\\x3b}
        line=${line//$'\n'/\\x0a}
        line=${line//$'\t'/\\x09}
        line=${line//$'\r'/\\x0d}
        line=${line//$'\e'/\\x1b}
        line=${line//$'\a'/\\x07}
        if [[ $line == *[[:cntrl:]]* ]]; then
            local out= ch i
            for ((i = 0; i < ${#line}; i++)); do
                ch=${line:i:1}
                [[ $ch == [[:cntrl:]] ]] && builtin printf -v ch '\\x%02x' "'$ch"
                out+=$ch
            done
            line=$out
        fi
        builtin printf '\e]133;C;fresh=%s;p=%s;at=%s;cmdline=%s;tether=%s\a' \
            "$fresh" "$__tether_prompt" "${EPOCHREALTIME-}" "$line" "$__tether_nonce"
    }

    __tether_order
    PS0='$(__tether_preexec)'"${PS0-}"
    builtin printf '\e]133;A;tether=%s\a' "$__tether_nonce"
else
    unset __tether_nonce
fi
